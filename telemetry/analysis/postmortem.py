"""The post-mortem's own questions, answered from a bundle or a store (``bundle_reader.load``).

What failed and where (``failure_summary``, ``failure_point``, ``failure_frames``), the ops that
led to it (``ops_before_failure``) and the requests involved (``requests_involved``). The tree,
diff and budget figures come from ``ui.shaping``; the miss explanations from
``telemetry.analysis.miss.explain``. ``notebooks/postmortem.ipynb`` only calls these.
"""

from __future__ import annotations

import pandas as pd

from radixscope.cache import events as ev


def recorded_failure(rec) -> dict | None:
    """What went wrong: a bundle's failure, else a store's last recorded violation that names
    an op (the engine's report: ``op_id``, ``op``, ``rule``, ``nodes``, ``req_id``, ``seq``),
    else None. A store's violation has no exception, traceback or live state."""
    f = rec.failure()
    if f is not None or rec.is_bundle:
        return f
    v = rec.violations()
    for seq, message, details in zip(reversed(list(v.get("seq", []))),
                                     reversed(list(v.get("message", []))),
                                     reversed(list(v.get("details", []))), strict=True):
        d = details if isinstance(details, dict) else {}
        if d.get("op_id") is not None and seq is not None and not pd.isna(seq):
            nodes = [n for n in d.get("nodes") or [] if isinstance(n, int)]
            return {"op_id": d["op_id"], "op": d.get("op"), "req_id": d.get("req_id"),
                    "rule": d.get("rule"), "nodes": nodes, "node": nodes[0] if nodes else None,
                    "seq": int(seq), "message": message, "exception": None}
    return None


def failure_point(rec) -> tuple[int, int]:
    """``(seq just before the failing op, seq at the failure)``. For a store: its last recorded
    violation's op (``recorded_failure``); with none, the seqs around its last op."""
    f = recorded_failure(rec)
    ops = rec.ops()
    if f is None:
        last = rec.last_seq()
        before = int(ops["seq_first"].iloc[-1]) - 1 if not ops.empty else last
        return max(before, _first_seq(rec)), last
    row = ops[ops["op_id"] == f.get("op_id")] if f.get("op_id") is not None else ops.iloc[0:0]
    before = int(row["seq_first"].iloc[-1]) - 1 if not row.empty else int(f["seq"])
    return max(before, _first_seq(rec)), int(f["seq"])


def _first_seq(rec) -> int:
    kf = rec.keyframes()
    return int(kf["seq"].min()) if not kf.empty else 0


def failure_summary(rec) -> str:
    """What failed, in plain lines: the op, the exception, the node, the numbers, the checks."""
    f = rec.failure()
    if f is None:
        return _store_summary(rec)
    who = f"op {f['op_id']}" if f.get("op_id") is not None else "op id unknown"
    if f.get("req_id"):
        who += f", req {f['req_id']}"
    if f["exception"] is None:
        lines = [f"ON-DEMAND BUNDLE at seq {f['seq']} ({f.get('note') or 'no note'})"]
    else:
        lines = [f"FAILED OP: {f['op'] or 'unknown'} ({who}) at seq {f['seq']}",
                 f"EXCEPTION: {f['exception']}: {f['message']}"]
    lines.append(f"NODE: {f['node'] if f['node'] is not None else 'none named'}")
    if f.get("nodes"):
        lines.append("NODES: " + ", ".join(str(n) for n in f["nodes"]))
    if f.get("rule"):
        lines.append(f"RULE: {f['rule']}")
    if f.get("op_seqs"):
        lines.append(f"OP SEQS: {f['op_seqs'][0]}..{f['op_seqs'][1]}")
    if f.get("oom"):
        o = f["oom"]
        lines.append(f"OOM: {o['component']}/{o['tier']} requested {o['requested']}, available "
                     f"{o['available']}, evictable {o['evictable']}, protected {o['protected']}")
    checked = rec.check_violations()
    if checked.empty:
        lines.append("INVARIANTS at the failure: all hold")
    else:
        lines.append(f"INVARIANTS at the failure: {len(checked)} violation(s)")
        lines += [f"  [{r.name}] node={'-' if pd.isna(r.node) else int(r.node)}: {r.detail}"
                  for r in checked.itertuples()]
    m = rec.manifest()
    rp, w = m.get("replay") or {}, m.get("window") or {}
    if rp.get("ok") is True:
        lines.append("REPLAY: the journal replays exactly to the live state at the failure")
    elif rp.get("ok") is False:
        lines.append(f"REPLAY: {rp.get('why')}")
        lines += [f"  {kind} {ident}: replayed {a} | live {b}"
                  for kind, ident, a, b in rp.get("diff", [])[:10]]
    lines.append(f"WINDOW: ops {w.get('first_op_id')}..{w.get('last_op_id')}, mutations "
                 f"{w.get('first_seq')}..{w.get('last_seq')}, keyframe at seq "
                 f"{w.get('keyframe_seq')}")
    return "\n".join(lines)


def _store_summary(rec) -> str:
    """A store has no crash bundle: its recorded violations, the one the post-mortem follows
    (``recorded_failure``) named first with its op, request, rule and nodes."""
    v = rec.violations()
    head = f"{rec.path} is a telemetry store (last seq {rec.last_seq()}), not a crash bundle"
    if v.empty:
        return f"NO FAILURE RECORDED: {head}; it recorded no violation"
    lines = [f"{head}; it recorded {len(v)} violation(s)"]
    f = recorded_failure(rec)
    if f is not None:
        who = f"op {f['op_id']}" + (f", req {f['req_id']}" if f.get("req_id") else "")
        lines += [f"FAILED OP: {f['op'] or 'unknown'} ({who}) at seq {f['seq']}",
                  f"VIOLATION: {f['message']}",
                  f"NODE: {f['node'] if f['node'] is not None else 'none named'}"]
        if f["nodes"]:
            lines.append("NODES: " + ", ".join(str(n) for n in f["nodes"]))
        if f.get("rule"):
            lines.append(f"RULE: {f['rule']}")
    shown = None if f is None else (f["seq"], f["message"])
    for s, m in zip(v.get("seq", []), v.get("message", []), strict=False):
        if shown is not None and (s, m) == shown:
            shown = None  # the followed one, named above: the others only (repeats too)
            continue
        lines.append(f"VIOLATION at seq {s}: {m}")
    return "\n".join(lines)


def failure_frames(rec, innermost: int = 6) -> pd.DataFrame:
    """The innermost frames of the failure's traceback: file, line, function, source."""
    f = rec.failure() or {}
    frames = (f.get("frames") or [])[-innermost:]
    return pd.DataFrame([{k: fr[k] for k in ("file", "line", "function", "source")}
                         for fr in frames], columns=["file", "line", "function", "source"])


def ops_before_failure(rec, n: int = 20) -> pd.DataFrame:
    """The last ``n`` ops up to and including the failing one (``recorded_failure``), with the
    node each named, the mutations it made and its duration."""
    ops = rec.ops()
    f = recorded_failure(rec)
    if f is not None and f.get("op_id") is not None:
        ops = ops[ops["op_id"] <= f["op_id"]]
    ops = ops.tail(n)
    node = [a.get(ev.A_NODE) if isinstance(a, dict) else None for a in ops["attrs"]]
    out = pd.DataFrame({
        "op_id": ops["op_id"], "op": ops["op"], "req_id": ops["req_id"],
        "seq_first": ops["seq_first"], "seq_last": ops["seq_last"],
        "mutations": ops["seq_last"] - ops["seq_first"] + 1,
        "node": pd.array(node, dtype="Int64"),
        "duration_us": (ops["end_ns"] - ops["start_ns"]) / 1e3, "error": ops["error"]})
    return out.reset_index(drop=True)


def requests_involved(rec, n_ops: int = 50) -> list[str]:
    """Request ids of the failing op (``recorded_failure``) and of the last ``n_ops`` ops before
    it, most recent first."""
    f = recorded_failure(rec) or {}
    out: list[str] = [f["req_id"]] if f.get("req_id") else []
    ops = rec.ops()
    if f.get("op_id") is not None:
        ops = ops[ops["op_id"] <= f["op_id"]]
    for r in reversed(list(ops["req_id"].tail(n_ops))):
        if isinstance(r, str) and r not in out:
            out.append(r)
    return out
