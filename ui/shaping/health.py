"""Health: recorded invariant violations tied to the op that caused them, each violation line as
a row, the snapshot doctor (``telemetry.analysis.doctor``) and the telemetry's own health in words."""

from __future__ import annotations

import re

import pandas as pd

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.analysis import doctor
from radixscope.telemetry.analysis.storage_doctor import pending_from_events, storage_findings

_LINE = re.compile(r"^\s*\[(?P<check>[^\]]+)\]\s+node=(?P<node>None|-?\d+):\s*(?P<detail>.*)$")


def causing_op(ops_table: pd.DataFrame, seq: int | None) -> pd.Series | None:
    """The op that produced the state at ``seq``: the op whose mutations include ``seq``, else
    the last op that ended at or before it (None when there is none)."""
    if seq is None or ops_table.empty:
        return None
    first = ops_table["seq"] - ops_table["mutations"] + 1
    hit = ops_table[(first <= seq) & (ops_table["seq"] >= seq) & (ops_table["mutations"] > 0)]
    if hit.empty:
        hit = ops_table[ops_table["seq"] <= seq]
    return None if hit.empty else hit.iloc[-1]


def violations_with_ops(violations: pd.DataFrame, ops_table: pd.DataFrame) -> pd.DataFrame:
    """Each recorded violation with its causing op, the broken rule and the nodes: ``id, seq,
    kind, rule, nodes, headline, op_id, op, req_id, message``. The op is the one the
    violation's ``details["op_id"]`` names (the engine names it: a check after every call, or
    a re-run that locates it), else ``causing_op`` of its seq. The rule and nodes come from
    the details (``rule`` / ``invariant``, ``nodes`` / ``node``), else from the message's
    ``[check] node=N`` lines."""
    cols = ["id", "seq", "kind", "rule", "nodes", "headline", "op_id", "op", "req_id", "message"]
    rows = []
    for v in violations.itertuples(index=False):
        seq = None if pd.isna(v.seq) else int(v.seq)
        details = v.details if isinstance(v.details, dict) else {}
        named = details.get("op_id")
        exact = ops_table[ops_table["op_id"] == named] if named is not None else ops_table.iloc[:0]
        op = exact.iloc[-1] if not exact.empty else causing_op(ops_table, seq)
        head = str(v.message).splitlines()[0].rstrip(":") if v.message else ""
        rule, nodes = _rule_and_nodes(details, str(v.message or ""))
        rows.append((int(v.id), seq, v.kind, rule, nodes, head,
                     None if op is None else int(op["op_id"]),
                     None if op is None else op["op"], None if op is None else op["req_id"],
                     v.message))
    return pd.DataFrame(rows, columns=cols, dtype=object)


def _rule_and_nodes(details: dict, message: str) -> tuple[str | None, str]:
    rule = details.get("rule") or details.get("invariant") or details.get("name")
    nodes = details.get("nodes")
    if not isinstance(nodes, list):
        nodes = [details["node"]] if isinstance(details.get("node"), int) else []
    lines = violation_lines(message)
    if rule is None and not lines.empty:
        rule = lines["check"].iloc[0]
    if not nodes and not lines.empty:
        nodes = [int(n) for n in lines["node"] if n >= 0]
    nodes = [int(n) for n in dict.fromkeys(nodes) if isinstance(n, int)]
    return (None if rule is None else str(rule)), ", ".join(str(n) for n in nodes)


def injected_fault(events: pd.DataFrame) -> dict | None:
    """The bug-zoo fault a run was started with (its ``zoo.inject`` event), or None."""
    if events.empty or "kind" not in events:
        return None
    rows = events[events["kind"] == "zoo.inject"]
    if rows.empty:
        return None
    attrs = rows["attrs"].iloc[-1]
    return attrs if isinstance(attrs, dict) else None


def injection_words(fault: dict, viol: pd.DataFrame) -> str:
    """One paragraph: which class was injected and what caught it, where."""
    text = (f"Injected fault (bug zoo) class {fault.get('class')} `{fault.get('name')}`: "
            f"{fault.get('title')}. Shipped in: {fault.get('shipped')}. Caught by: "
            f"{fault.get('caught_by')}.")
    if not viol.empty:
        v = viol.iloc[0]
        text += (f" Stopped at op {v['op_id']} (`{v['op']}`, request {v['req_id']}), seq "
                 f"{v['seq']}: rule `{v['rule']}`, nodes {v['nodes'] or 'none named'}.")
    return text


def violation_lines(message: str) -> pd.DataFrame:
    """The ``[check] node=N: detail`` lines of an ``InvariantViolation`` message as rows
    ``check, node, detail`` (node -1 when the check names none); other text is skipped."""
    rows = []
    for line in str(message).splitlines():
        m = _LINE.match(line)
        if m:
            node = m.group("node")
            rows.append((m.group("check"), -1 if node == "None" else int(node),
                         m.group("detail")))
    return pd.DataFrame(rows, columns=["check", "node", "detail"])


def findings_table(snap: CacheSnapshot, events: pd.DataFrame | None = None,
                   pools_known: bool = True) -> pd.DataFrame:
    """``telemetry.analysis.doctor.findings`` as ``severity, subject, message`` rows; with the
    store's ``events``, the L3 findings too (``storage_doctor``: prefetches started by seq
    ``snap.seq`` and never handed back past their budget, host pins leaked by finished
    prefetches / store transfers), "now" being the last event's time at that seq.
    ``pools_known``: ``doctor.pool_sizes_known`` of the store's info (false for a watched
    engine, whose capacities are not checked)."""
    found = doctor.findings(snap, pools_known)
    if events is not None and not events.empty:
        upto = events[events["seq"].fillna(-1) <= snap.seq] if "seq" in events else events
        now = int(upto["ts_ns"].max()) if not upto.empty else 0
        found += storage_findings(snap, pending_from_events(upto), now)
        rank = {doctor.ERROR: 0, doctor.WARNING: 1, doctor.INFO: 2}
        found.sort(key=lambda f: rank[f.severity])
    return pd.DataFrame([(f.severity, f.subject, f.message) for f in found],
                        columns=["severity", "subject", "message"])


def telemetry_words(info: dict) -> list[str]:
    """The store's own health: dropped records, sink failures and journal gaps, in words.

    Args:
        info: ``StoreReader.info()``.
    """
    out = []
    stats = info.get("stats") or {}
    dropped = {k: v for k, v in (stats.get("dropped") or {}).items() if v}
    failures = {k: v for k, v in (stats.get("failures") or {}).items() if v}
    gaps = info.get("gaps") or []
    if dropped:
        out.append("dropped records: " + ", ".join(f"{v} {k}" for k, v in sorted(dropped.items()))
                   + " (the recorder's queue overflowed)")
    if failures:
        out.append("telemetry failures: " + ", ".join(f"{k} x{v}"
                                                      for k, v in sorted(failures.items())))
    for a, b in gaps:
        out.append(f"journal gap after seq {a} (next seq {b}): states after seq {a} cannot be "
                   "rebuilt exactly")
    if not stats:
        out.append("no telemetry stats yet: the writer has not flushed (a run still going?)")
    elif not out:
        out.append("telemetry healthy: nothing dropped, no failures, no journal gaps")
    if (info.get("cache") or {}).get("kernels") == "python":
        out.append("the cache ran on its Python kernels (built without a C compiler, or "
                   "RADIXSCOPE_NATIVE=0): its match, insert, alloc and evict cost about 1.5x "
                   "the native ones; see README, Quickstart")
    if (info.get("cache") or {}).get("ledger") == "python":
        out.append("the cache ran on its Python ledger (built without a C compiler, or "
                   "RADIXSCOPE_NATIVE=0): the bookkeeping of each recorded operation cost about "
                   "twice the native one's (0.5 us against 0.3); see README, Quickstart")
    if (info.get("cache") or {}).get("leaf_heap") == "python":
        out.append("the cache ran on its Python leaf heap (built without a C compiler, or "
                   "RADIXSCOPE_NATIVE=0): each FULL eviction cost about 1.2x the native one's "
                   "(22-25 us against 18 at 1 k nodes); see README, Quickstart")
    if (info.get("settings") or {}).get("encoder") == "python":
        out.append("the recorder ran on its Python encoder (built without a C compiler, or "
                   "RADIXSCOPE_NATIVE=0): telemetry cost each op about a third more than on "
                   "the native one; see README, Quickstart")
    return out
