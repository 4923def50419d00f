"""The end-of-run summary: plain numbers (``summarize``) and the table ``radixscope run`` prints.

Hit rates are per component and tier, over what the finished requests looked up at their
(last) admission:

- FULL: prompt tokens; *device* = reused from device memory, *host* = loaded back from host.
- SWA: the window behind each request's reused prefix (``min(window, prompt)`` tokens looked up);
  *host* = window tokens loaded back, *device* = the rest of the window that was reused.
- MAMBA: one state per request; *device* = copied from a device state, *host* = loaded back.

With an L3 tier, *storage* counts the FULL tokens of the host column that an L3 prefetch
brought to host first (so they are also in *host*); the other components show ``-``.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixscope.cache import native
from radixscope.cache.components import BACKBONE, STATE, WINDOW, rules
from radixscope.engine.run import RunResult


@dataclass(frozen=True)
class HitRate:
    component: str
    unit: str
    looked_up: int
    device: int
    host: int
    storage: int | None = None  # of ``host``: tokens an L3 prefetch brought (None: not counted)

    @property
    def miss(self) -> int:
        return self.looked_up - self.device - self.host

    def pct(self, n: int) -> float:
        return 100.0 * n / self.looked_up if self.looked_up else 0.0


@dataclass(frozen=True)
class OpLatency:
    op: str
    count: int
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class Summary:
    workload: str
    preset: str
    components: tuple[str, ...]
    write_policy: str
    requests: int
    finished: int
    rejected: int
    retractions: int
    refusals: int
    steps: int
    wall_s: float
    cache_s: float
    hits: tuple[HitRate, ...]
    evictions: tuple[tuple[str, str, int, int], ...]  # (component, tier, values, slots)
    backups: int
    load_backs: int
    moved: tuple[tuple[str, str, int], ...]  # (kind, component, slots)
    latency: tuple[OpLatency, ...]
    verified_prefixes: int
    verified_tokens: int
    budget_violations: int
    checked: bool  # check() after every step (--check-invariants)
    error: str | None
    error_kind: str | None
    store: str | None
    bundles: tuple[str, ...] = ()
    storage: str | None = None      # the L3 backend spec
    storage_line: str = ""          # what L3 did: pages written / failed, prefetches
    kernels: str = native.KERNELS   # the cache's hot-path kernels: "native" or "python"
    strict: bool = False            # check() after every cache call (--inject)
    # branching points (hybrids): admissions whose match reported one; filled in by an insert;
    # MAMBA states kept there
    branch_points: int = 0
    branches_filled: int = 0
    branch_states: int = 0
    # what telemetry lost ("" when nothing): failures at close, dropped records
    telemetry_problem: str = ""
    export_problem: str = ""  # exporters that failed (the store is whole): stage counts
    device: str = "cpu"  # the device pools' device
    # CUDA: (kind, bytes, side-stream seconds) of the acked backups and load-backs
    copies: tuple[tuple[str, int, float], ...] = ()

    @property
    def requests_per_s(self) -> float:
        return self.finished / self.wall_s if self.wall_s else 0.0


def _pctl(values: list[int], q: float) -> float:
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k] / 1000.0


def hit_rates(result: RunResult) -> tuple[HitRate, ...]:
    seqs = result.engine.done
    comps = result.config.components
    l3 = result.spec.storage is not None
    out = [HitRate(BACKBONE, rules(BACKBONE).unit, sum(s.prompt_len for s in seqs),
                   sum(s.device_hit for s in seqs), sum(s.host_hit for s in seqs),
                   sum(s.storage_hit for s in seqs) if l3 else None)]
    if WINDOW in comps:
        w = result.config.sliding_window
        look = dev = host = 0
        for s in seqs:
            look += min(w, s.prompt_len)
            win = min(w, s.reused)
            loaded = min(win, s.swa_loaded)
            host += loaded
            dev += win - loaded
        out.append(HitRate(WINDOW, rules(WINDOW).unit, look, dev, host))
    if STATE in comps:
        out.append(HitRate(STATE, rules(STATE).unit, len(seqs), sum(s.mamba_device_hit for s in seqs),
                           sum(1 for s in seqs if s.mamba_loaded)))
    return tuple(out)


def summarize(result: RunResult) -> Summary:
    e, counter = result.engine, result.counter
    comps = result.config.components
    evictions = tuple((c, t, counter.evictions[(c, t)], counter.evicted[(c, t)])
                      for c in comps for t in (p.label for p in e.cache.pool_tiers))
    moved = tuple((k, c, counter.moved[(k, c)]) for k in ("backup", "load_back") for c in comps)
    lat = tuple(OpLatency(op, len(ns), _pctl(ns, 0.5), _pctl(ns, 0.99))
                for op, ns in sorted(counter.op_ns.items()) if ns)
    d = e.admitter
    return Summary(
        workload=result.spec.workload, preset=result.spec.preset_name(), components=comps,
        write_policy=result.config.write_policy, requests=e.total, finished=len(e.done),
        rejected=len(e.rejected), retractions=e.retractions, refusals=d.refusals,
        steps=e.step_no, wall_s=result.wall_s, cache_s=result.cache.ns / 1e9,
        hits=hit_rates(result), evictions=evictions,
        backups=counter.transfers["backup"], load_backs=counter.transfers["load_back"],
        moved=moved, latency=lat, verified_prefixes=d.verified, verified_tokens=d.verified_tokens,
        budget_violations=len(d.budget_violations), checked=result.spec.check_invariants,
        error=result.error, error_kind=result.error_kind, store=result.store,
        bundles=tuple(str(p) for p in result.bundles), storage=result.spec.storage,
        storage_line=_storage_line(result), strict=result.strict, branch_points=d.branch_points,
        branches_filled=e.driver.branches_filled, branch_states=e.driver.branch_states,
        telemetry_problem=telemetry_problem(result.telemetry_stats),
        export_problem=export_problem(result.telemetry_stats),
        device=str(result.config.device),
        copies=tuple((k, counter.copy_bytes[k], counter.copy_ns[k] / 1e9)
                     for k in ("backup", "load_back") if counter.copy_ns[k]))


# failure stages that only export (spans, metrics, KV events, OTLP): the store is whole
_EXPORT_STAGES = ("span_export", "metrics", "batch_span_processor", "provider.", "kv_events",
                  "exporter.", "prioritize", "flush.deprioritize")


def _keeps_store(stage: str) -> bool:
    """Whether a failure at ``stage`` can leave the store missing part of the run."""
    if stage.startswith("sink."):
        return stage.startswith("sink.StoreSink.")
    return not stage.startswith(_EXPORT_STAGES)


def telemetry_problem(stats: dict | None) -> str:
    """What the run's store lost, in words ("" when nothing): failures at the stages that keep
    it (recording, the drain, the writer, the store) per stage, and the records dropped."""
    if not stats:
        return ""
    parts = []
    failures = {k: n for k, n in (stats.get("failures") or {}).items() if _keeps_store(k)}
    if failures:
        where = ", ".join(f"{stage} {n:,}" for stage, n in sorted(failures.items()))
        parts.append(f"telemetry failed ({where}; logged above)")
    dropped = {k: n for k, n in (stats.get("dropped") or {}).items() if n}
    if dropped:
        parts.append("dropped " + ", ".join(f"{n:,} {k}s" for k, n in sorted(dropped.items())))
    return "; ".join(parts)


def export_problem(stats: dict | None) -> str:
    """Failures of the exporters alone (spans, metrics, KV events): the store is whole."""
    failures = {k: n for k, n in ((stats or {}).get("failures") or {}).items()
                if not _keeps_store(k)}
    return ", ".join(f"{stage} {n:,}" for stage, n in sorted(failures.items()))


def _storage_line(result: RunResult) -> str:
    cache = result.cache.cache
    if cache.storage is None:
        return ""
    st = result.storage_stats or cache.storage_stats()  # the backend is closed after a run
    w, p = st.writes, st.prefetch
    failed = ", ".join(f"{k} {v:,}" for k, v in sorted(w.pages_failed.items())) or "none failed"
    if w.write_back_pages:  # written synchronously as eviction demoted their nodes
        failed = f"{w.write_back_pages:,} of them by write_back, {failed}"
    return (f"{st.backend.backend}, {cache.storage.write_policy}: "
            f"{w.pages_stored + w.write_back_pages:,} pages written ({failed}); prefetch "
            f"{cache.storage.prefetch.policy.value}: "
            f"{p.started:,} started, {p.prefetched_tokens:,} tokens brought")


def _copy_rate(nbytes: int, secs: float) -> str:
    """Bytes copied and their rate on the side stream (CUDA events)."""
    return (f"{nbytes / 1e6:,.1f} MB in {secs * 1e3:,.2f} ms on the side stream, "
            f"{nbytes / secs / 1e9:,.1f} GB/s")


def format_summary(s: Summary) -> str:
    """The table printed at the end of ``radixscope run``."""
    share = 100.0 * s.cache_s / s.wall_s if s.wall_s else 0.0
    lines = [
        f"radixscope run: workload {s.workload}, preset {s.preset} "
        f"({'+'.join(s.components)}), {s.write_policy}, on {s.device}",
        f"  requests     {s.finished} finished, {s.rejected} rejected of {s.requests}; "
        f"{s.retractions} retracted; {s.refusals} admission refusals; {s.steps} steps",
        f"  time         {s.wall_s:.2f} s, {s.requests_per_s:.1f} requests/s, "
        f"{share:.0f}% inside cache calls",
        "  hit rate     component    looked up      device        host        miss"
        + ("     storage" if s.storage else ""),
    ]
    for h in s.hits:
        l3 = "" if not s.storage else (f"{'-':>12}" if h.storage is None
                                        else f"{h.pct(h.storage):>11.1f}%")
        lines.append(f"               {h.component:<9}{h.looked_up:>10,} {h.unit:<6}"
                     f"{h.pct(h.device):>6.1f}%{h.pct(h.host):>11.1f}%{h.pct(h.miss):>11.1f}%"
                     + l3)
    if len(s.components) > 1:  # a hybrid: where FULL's match reached past SWA / MAMBA's
        lines.append(f"  branching    {s.branch_points:,} points reported, "
                     f"{s.branches_filled:,} filled in"
                     + (f" ({s.branch_states:,} MAMBA states kept)" if STATE in s.components
                        else ""))
    ev_parts = [f"{c}/{t} {n:,} ({slots:,} {rules(c).unit})"
                for c, t, n, slots in s.evictions if n]
    lines.append("  evictions    " + (", ".join(ev_parts) if ev_parts else "none"))
    for kind, label, count in (("backup", "backups", s.backups),
                               ("load_back", "load-backs", s.load_backs)):
        parts = [f"{c} {n:,} {rules(c).unit}" for k, c, n in s.moved if k == kind and n]
        copied = [_copy_rate(b, secs) for k, b, secs in s.copies if k == kind]
        lines.append(f"  {label:<12} {count:,}" + (f" ({', '.join(parts)})" if parts else "")
                     + (f"; {copied[0]}" if copied else ""))
    lines.append(f"  op latency   op              count    p50 us    p99 us   ({s.kernels} "
                 "kernels)")
    for o in s.latency:
        lines.append(f"               {o.op:<13}{o.count:>8,}{o.p50_us:>10.1f}{o.p99_us:>10.1f}")
    lines.append(f"  content      {s.verified_prefixes:,} reused prefixes verified "
                 f"({s.verified_tokens:,} tokens), "
                 f"{'MISMATCH' if s.error_kind == 'content' else 'no mismatch'}")
    lines.append(f"  budget       {s.budget_violations} admitted requests ran out of memory in "
                 "their load-back or first chunk")
    if s.error_kind == "invariant":
        inv = "VIOLATED: " + (s.error or "")
    elif s.strict:
        inv = "ok (check() after every cache call)"
    elif s.checked:
        inv = "ok (check() after every step)"
    else:
        inv = "not checked (use --check-invariants)"
    lines.append(f"  invariants   {inv}")
    if s.error is not None and s.error_kind != "invariant":
        lines.append(f"  error        {s.error}")
    if s.storage:
        lines.append(f"  storage      {s.storage}: {s.storage_line}")
    if s.store:
        lines.append(f"  store        {s.store} (radixscope ui {s.store})" if not
                     s.telemetry_problem else f"  store        {s.store}, INCOMPLETE: "
                     f"{s.telemetry_problem}")
    if s.export_problem:
        lines.append(f"  exporters    failed: {s.export_problem} (logged above; the store "
                     "is not affected)")
    for b in s.bundles:
        lines.append(f"  bundle       {b} (telemetry.analysis.load.load_bundle; "
                     "notebooks/postmortem.ipynb)")
    return "\n".join(lines)


__all__ = ["Summary", "HitRate", "OpLatency", "summarize", "format_summary", "hit_rates"]
