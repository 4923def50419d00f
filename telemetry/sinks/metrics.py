"""OTel metrics derived from the one event stream (the op records and the mutation journal).

- observable gauges per component x tier: capacity, available, evictable, protected, in-flight
  and held slots, read from the sink's ``Journal`` when the reader collects;
- counters: hit tokens per component and tier (tier ``storage``: the match's host hit that a
  prefetch brought from L3), looked-up tokens, evicted tokens per component and
  tier, backup / load-back tokens (per component, from the journal's finished transfers) and
  bytes (from transfer records), admission decisions;
- histograms: op durations per op name and transfer durations per transfer kind;
- observable counters of telemetry's own dropped records and failures;
- the L3 tier's (``storage_metrics.py``): prefetches, prefetched / unfulfilled tokens per
  reason, storage pages, bytes and bandwidth per call kind, store-transfer slots.

Labels are closed sets (component, tier, op name, transfer kind, result); node ids never appear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from radixscope.cache import events as ev
from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.telemetry import names as n
from radixscope.telemetry.record.encode import CompactOp
from radixscope.telemetry.sinks.storage_metrics import StorageMetrics
from radixscope.telemetry.store.journal import Journal

_HITS = ((ev.A_DEVICE_TOKENS, BACKBONE, ev.TIER_DEVICE), (ev.A_HOST_TOKENS, BACKBONE, ev.TIER_HOST),
         (ev.A_SWA_HOST_TOKENS, WINDOW, ev.TIER_HOST), (ev.A_MAMBA_HOST, STATE, ev.TIER_HOST),
         *(((ev.A_STORAGE_HIT, BACKBONE, ev.TIER_STORAGE),) if hasattr(ev, "A_STORAGE_HIT")
           else ()))
BACKUP_KINDS = ("backup", "write_back", "write_through")
LOAD_BACK_KINDS = ("load_back", "load")
STORE_KIND = "store"  # host -> L3 (tier "storage")


def transfer_family(kind: object) -> str | None:
    """``"backup"`` (device -> host), ``"load_back"`` (host -> device), ``"store"`` (host ->
    L3) or None for other kinds."""
    k = str(kind)
    if k == STORE_KIND:
        return STORE_KIND
    if k in BACKUP_KINDS or k.startswith("backup"):
        return "backup"
    if k in LOAD_BACK_KINDS or k.startswith("load_back"):
        return "load_back"
    return None


class CacheMetrics:
    """The instruments, fed by the sink.

    Args:
        meter_provider: any OTel ``MeterProvider`` (the API no-op one records nothing).
        stats: callable returning merged telemetry health (``{"dropped": .., "failures": ..}``).
    """

    def __init__(self, meter_provider: metrics.MeterProvider, stats: Callable[[], dict]) -> None:
        m = meter_provider.get_meter(n.INSTRUMENTATION_SCOPE)
        self.journal: Journal | None = None
        self._stats = stats
        self._transfers: dict[int, tuple[str, tuple]] = {}
        gauges = ((n.M_POOL_CAPACITY, 2), (n.M_POOL_AVAILABLE, 3), (n.M_POOL_EVICTABLE, 4),
                  (n.M_POOL_PROTECTED, 5), (n.M_POOL_IN_FLIGHT, 6), (n.M_POOL_HELD, -1))
        for name, col in gauges:
            m.create_observable_gauge(name, [self._pool_callback(col)], unit=n.UNIT_SLOTS,
                                      description=f"{name.rsplit('.', 1)[1]} slots per pool")
        self.hit_tokens = m.create_counter(n.M_HIT_TOKENS, n.UNIT_TOKENS,
                                           "matched tokens per component and tier")
        self.lookup_tokens = m.create_counter(n.M_LOOKUP_TOKENS, n.UNIT_TOKENS,
                                              "tokens of the keys matched")
        self.evicted_tokens = m.create_counter(n.M_EVICTED_TOKENS, n.UNIT_SLOTS,
                                               "slots freed by eviction per component and tier")
        self.backup_tokens = m.create_counter(n.M_BACKUP_TOKENS, n.UNIT_SLOTS,
                                              "slots copied device -> host")
        self.backup_bytes = m.create_counter(n.M_BACKUP_BYTES, "By", "bytes copied device -> host")
        self.load_back_tokens = m.create_counter(n.M_LOAD_BACK_TOKENS, n.UNIT_SLOTS,
                                                 "slots copied host -> device")
        self.load_back_bytes = m.create_counter(n.M_LOAD_BACK_BYTES, "By",
                                                "bytes copied host -> device")
        self.store_tokens = m.create_counter(n.M_STORE_TOKENS, n.UNIT_SLOTS,
                                             "slots written host -> L3 (acked store transfers)")
        self.store_bytes = m.create_counter(n.M_STORE_BYTES, "By",
                                            "bytes written host -> L3 (acked store transfers)")
        self.storage = StorageMetrics(meter_provider)
        self.admissions = m.create_counter(n.M_ADMISSIONS, "{decision}", "admission decisions")
        self.op_duration = m.create_histogram(
            n.M_OP_DURATION, "s", "cache operation duration",
            explicit_bucket_boundaries_advisory=n.DURATION_BUCKETS_S)
        self.transfer_duration = m.create_histogram(
            n.M_TRANSFER_DURATION, "s", "asynchronous transfer duration",
            explicit_bucket_boundaries_advisory=n.DURATION_BUCKETS_S)
        m.create_observable_counter(n.M_TELEMETRY_DROPPED, [self._dropped_callback],
                                    unit="{record}", description="records telemetry dropped")
        m.create_observable_counter(n.M_TELEMETRY_FAILURES, [self._failures_callback],
                                    unit="{failure}", description="telemetry failures")

    # ---- feeding ---------------------------------------------------------------------------
    def observe_ops(self, ops: Iterable[CompactOp]) -> None:
        """Count hits, evictions and bytes and record durations of a batch of ops."""
        for op in ops:
            a = op.attrs
            dur = max(0, op.end_ns - op.start_ns) / 1e9
            if op.op == ev.OP_TRANSFER:
                kind = str(a.get(ev.A_TRANSFER_KIND, "unknown"))
                self.transfer_duration.record(dur, {n.LABEL_TRANSFER_KIND: kind})
                nbytes = a.get(ev.A_BYTES)
                if isinstance(nbytes, int) and nbytes > 0 and not op.error:
                    fam = transfer_family(kind)
                    if fam == "backup":
                        self.backup_bytes.add(nbytes)
                    elif fam == "load_back":
                        self.load_back_bytes.add(nbytes)
                    elif fam == STORE_KIND:
                        self.store_bytes.add(nbytes)
                continue
            self.op_duration.record(dur, {n.LABEL_OP: op.op})
            if op.op == ev.OP_MATCH:
                for key, comp, tier in _HITS:
                    v = a.get(key)
                    if isinstance(v, int) and v > 0:
                        self.hit_tokens.add(v, {n.LABEL_COMPONENT: comp, n.LABEL_TIER: tier})
                k = a.get(ev.A_KEY_TOKENS)
                if isinstance(k, int) and k > 0:
                    self.lookup_tokens.add(k)
            elif op.op in (ev.OP_EVICT, ev.OP_EVICT_HOST):
                tier = ev.TIER_DEVICE if op.op == ev.OP_EVICT else ev.TIER_HOST
                freed = a.get(ev.A_FREED)
                items = freed.items() if isinstance(freed, dict) else (freed or ())
                for comp, v in items:
                    if isinstance(v, int) and v > 0:
                        self.evicted_tokens.add(v, {n.LABEL_COMPONENT: str(comp),
                                                    n.LABEL_TIER: tier})

    def observe_mutations(self, mutations: Iterable[tuple]) -> None:
        """Count backup / load-back slots per component when a transfer finishes successfully."""
        for m in mutations:
            kind = m[2]
            if kind == ev.TRANSFER_START:
                tid, tkind, _nodes, amounts = m[6]
                self._transfers[tid] = (str(tkind), tuple(amounts))
            elif kind == ev.TRANSFER_DONE:
                tid, ok = m[6][0], m[6][1]
                started = self._transfers.pop(tid, None)
                if started is None or not ok:
                    continue
                fam = transfer_family(started[0])
                counter = {"backup": self.backup_tokens, "load_back": self.load_back_tokens,
                           STORE_KIND: self.store_tokens}.get(fam or "")
                if counter is not None:
                    for comp, amount in started[1]:
                        if amount:
                            counter.add(int(amount), {n.LABEL_COMPONENT: str(comp)})

    def observe_admission(self, admitted: bool) -> None:
        self.admissions.add(1, {n.LABEL_ADMISSION_RESULT: "admitted" if admitted else "rejected"})

    # ---- callbacks (run on the metric reader's thread) -------------------------------------
    def _pool_callback(self, col: int) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(_options: CallbackOptions) -> list[Observation]:
            j = self.journal
            if j is None:
                return []
            out = []
            for p in j.pools():
                value = p[2] - p[3] - p[4] - p[5] if col < 0 else p[col]
                out.append(Observation(value, {n.LABEL_COMPONENT: p[0], n.LABEL_TIER: p[1]}))
            return out
        return callback

    def _dropped_callback(self, _options: CallbackOptions) -> list[Observation]:
        d = self._stats().get("dropped", {})
        return [Observation(v, {n.LABEL_RECORD: k}) for k, v in sorted(d.items())]

    def _failures_callback(self, _options: CallbackOptions) -> list[Observation]:
        f = self._stats().get("failures", {})
        return [Observation(v, {n.LABEL_STAGE: k}) for k, v in sorted(f.items())]
