"""OTel metrics of the L3 tier, from the prefetch observer's events and the store transfers.

- counters: prefetches ended per reason; tokens handed back (``kv_cache.prefetch.tokens``; the
  hits on tier ``storage`` are the match ops', in ``metrics.py``), tokens the existence query
  found; unfulfilled tokens per reason (the controller's own accounting: declined starts count
  what they asked, an end counts the storage miss and the rest under its reason); storage pages
  per call kind and status; bytes per call kind and component; store-transfer slots per
  component (host -> L3, from acked ``store`` transfers, in ``metrics.py``);
- histogram: bandwidth (bytes/s) of each storage call that moved bytes.

Labels are closed sets (reason, call kind, status, component, tier); request ids never appear.
"""

from __future__ import annotations

from opentelemetry import metrics

from radixscope.cache.components import BACKBONE
from radixscope.cache.storage import prefetch_events as pe
from radixscope.telemetry import names as n

_COUNTERS = (  # attribute, name, unit, description
    ("ended", n.M_PREFETCH_ENDED, "{prefetch}", "prefetches handed back or aborted, per reason"),
    ("prefetched", n.M_PREFETCH_TOKENS, n.UNIT_TOKENS, "tokens brought L3 -> host, handed back"),
    ("found", n.M_PREFETCH_FOUND_TOKENS, n.UNIT_TOKENS, "tokens the existence query found"),
    ("unfulfilled", n.M_PREFETCH_UNFULFILLED, n.UNIT_TOKENS,
     "tokens asked for and not handed back, per reason"),
    ("pages", n.M_STORAGE_PAGES, "{page}", "storage pages per call kind and status"),
    ("nbytes", n.M_STORAGE_BYTES, "By", "bytes moved to / from L3"),
)
_STOPPED = frozenset({pe.R_TERMINATED, pe.R_DEADLINE})
_CALL_OPS = {pe.STORAGE_EXISTS: "exists", pe.STORAGE_GET: "get", pe.STORAGE_SET: "set"}


def _int(v: object) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


class StorageMetrics:
    """The L3 instruments (module docstring), fed by ``observe(kind, attrs)``.

    Args:
        meter_provider: any OTel ``MeterProvider``.
    """

    def __init__(self, meter_provider: metrics.MeterProvider) -> None:
        m = meter_provider.get_meter(n.INSTRUMENTATION_SCOPE)
        for attr, name, unit, what in _COUNTERS:
            setattr(self, attr, m.create_counter(name, unit, what))
        self.bandwidth = m.create_histogram(
            n.M_STORAGE_BANDWIDTH, "By/s", "bandwidth of each storage call",
            explicit_bucket_boundaries_advisory=n.BANDWIDTH_BUCKETS)

    def observe(self, kind: str, attrs: dict) -> None:
        """Count one prefetch-observer event (kinds of ``prefetch_events``; others ignored)."""
        if kind == pe.PREFETCH_START:
            reason = str(attrs.get(pe.A_REASON))
            asked = _int(attrs.get(pe.A_TOKENS))
            if reason != "started" and asked:
                self.unfulfilled.add(asked, {n.LABEL_PREFETCH_REASON: reason})
        elif kind == pe.PREFETCH_END:
            self._end(attrs)
        elif kind in _CALL_OPS:
            self._call(_CALL_OPS[kind], attrs)

    def _end(self, attrs: dict) -> None:
        reason = str(attrs.get(pe.A_REASON))
        kept, hit = _int(attrs.get(pe.A_TOKENS)), _int(attrs.get(pe.A_HIT_TOKENS))
        comp = {n.LABEL_COMPONENT: BACKBONE}
        self.ended.add(1, {n.LABEL_PREFETCH_REASON: reason})
        if kept:
            self.prefetched.add(kept, comp)
        if hit:
            self.found.add(hit, comp)
        asked = _int(attrs.get("asked_tokens"))
        if not asked:
            return
        # hit 0 on a stopped prefetch: stopped before storage answered (the controller's
        # target is unknown, and it counts nothing as a storage miss then)
        unknown = reason == pe.R_ABORTED or (not hit and reason in _STOPPED)
        miss = 0 if unknown else max(0, asked - hit)
        rest = max(0, asked - kept - miss)
        if miss:
            self.unfulfilled.add(miss, {n.LABEL_PREFETCH_REASON: pe.R_STORAGE_MISS})
        if rest:
            self.unfulfilled.add(rest, {n.LABEL_PREFETCH_REASON: reason})

    def _call(self, op: str, attrs: dict) -> None:
        comp = str(attrs.get(pe.A_COMPONENT, BACKBONE))
        pages = _int(attrs.get(pe.A_PAGES))
        status = str(attrs.get(pe.A_STATUS, "ok"))
        if pages:
            self.pages.add(pages, {n.LABEL_STORAGE_OP: op, n.LABEL_STORAGE_STATUS: status,
                                   n.LABEL_COMPONENT: comp})
        nbytes = _int(attrs.get(pe.A_BYTES))
        if nbytes:
            labels = {n.LABEL_STORAGE_OP: op, n.LABEL_COMPONENT: comp}
            self.nbytes.add(nbytes, labels)
            secs = attrs.get(pe.A_SECONDS)
            if isinstance(secs, (int, float)) and secs > 0:
                self.bandwidth.record(nbytes / secs, labels)
