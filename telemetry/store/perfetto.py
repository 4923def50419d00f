"""Export a store as Chrome / Perfetto trace-event JSON (opens in ui.perfetto.dev).

Process "radixscope cache": one slice per cache op on "ops" tracks and one per asynchronous
transfer on "transfers" tracks (overlapping slices get extra lanes), a flow arrow from each
enqueuing op to its transfer, one counter track per component x tier (available, evictable,
protected, in_flight, held) and instants for violations and events. Process "spans": the host
process's own spans (engine requests...) as async slices. Times are microseconds from the first
timestamp in the store; the absolute start is in the metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from radixscope.cache import events as ev
from radixscope.telemetry.store.reader import open_store
from radixscope.telemetry.store.readguard import Malformed, damaged
from radixscope.telemetry.store.rows import enqueued_by

PID_CACHE = 1
PID_SPANS = 2
TID_OPS = 1
TID_TRANSFERS = 100
TID_MARKS = 200


def export_perfetto(store_path: str | os.PathLike, out_path: str | os.PathLike) -> dict:
    """Write a store's ops, transfers, pool counters, spans and events as trace-event JSON.

    Args:
        store_path: a telemetry store.
        out_path: the ``.json`` file to write.

    Returns:
        Counts of what was written: ``{"ops", "transfers", "counters", "spans", "marks"}``.

    Raises:
        FileNotFoundError / ValueError: as ``open_store``; ``ValueError`` naming the file for
            a row of the wrong shape (the readers' checks, ``telemetry.store.rows``).
    """
    with open_store(store_path) as r:
        ops, metrics, spans = r.ops(), r.metrics(), r.spans()
        violations, events = r.violations(), r.events()
    starts = [int(x) for df in (ops, metrics, spans, violations, events) if not df.empty
              for x in df["start_ns" if "start_ns" in df.columns else "ts_ns"]]
    t0 = min(starts) if starts else 0

    def us(ns: int) -> float:
        return (int(ns) - t0) / 1000.0

    out: list[dict] = [_meta("process_name", PID_CACHE, 0, "radixscope cache"),
                       _meta("process_name", PID_SPANS, 0, "spans")]
    counts = dict.fromkeys(("ops", "transfers", "counters", "spans", "marks"), 0)
    lanes: dict[int, list[int]] = {TID_OPS: [], TID_TRANSFERS: []}
    slice_at: dict[int, tuple[int, float]] = {}  # op_id -> (tid, ts) for flows
    if not ops.empty:
        ops = ops.sort_values(["start_ns", "op_id"], kind="stable")
    for row in ops.itertuples(index=False):
        is_transfer = row.op == ev.OP_TRANSFER
        base = TID_TRANSFERS if is_transfer else TID_OPS
        tid = base + _lane(lanes[base], int(row.start_ns), int(row.end_ns))
        attrs = row.attrs
        name = str(attrs.get(ev.A_TRANSFER_KIND, "transfer")) if is_transfer else row.op
        args = {"op_id": int(row.op_id), "seq": int(row.seq_last), **_plain(attrs)}
        if row.req_id is not None:
            args["req_id"] = row.req_id
        if row.error:
            args["error"] = row.error
        out.append({"ph": "X", "pid": PID_CACHE, "tid": tid, "name": name,
                    "cat": "transfer" if is_transfer else "op", "ts": us(row.start_ns),
                    "dur": max(0.0, (int(row.end_ns) - int(row.start_ns)) / 1000.0),
                    "args": args})
        slice_at[int(row.op_id)] = (tid, us(row.start_ns))
        counts["transfers" if is_transfer else "ops"] += 1
        try:
            enq = enqueued_by(attrs, row.op_id) if is_transfer else None
        except Malformed as e:
            raise damaged(store_path, "export_perfetto", e) from None
        if enq in slice_at:
            src_tid, src_ts = slice_at[enq]
            fid = int(row.op_id)
            out.append({"ph": "s", "id": fid, "pid": PID_CACHE, "tid": src_tid, "ts": src_ts,
                        "name": "enqueue", "cat": "transfer"})
            out.append({"ph": "f", "bp": "e", "id": fid, "pid": PID_CACHE, "tid": tid,
                        "ts": us(row.start_ns), "name": "enqueue", "cat": "transfer"})
    for tid_base, label in ((TID_OPS, "ops"), (TID_TRANSFERS, "transfers")):
        for i in range(max(1, len(lanes[tid_base]))):
            out.append(_meta("thread_name", PID_CACHE, tid_base + i,
                             label if i == 0 else f"{label} ({i + 1})"))
    for row in metrics.itertuples(index=False):
        out.append({"ph": "C", "pid": PID_CACHE, "name": f"{row.component}/{row.tier}",
                    "ts": us(row.ts_ns),
                    "args": {"available": int(row.available), "evictable": int(row.evictable),
                             "protected": int(row.protected), "in_flight": int(row.in_flight),
                             "held": int(row.held)}})
        counts["counters"] += 1
    cache_span_ids = set(ops["span_id"].dropna()) if not ops.empty else set()
    for row in spans.itertuples(index=False):
        if row.span_id in cache_span_ids or pd.notna(row.op_id):
            continue  # cache ops are already slices above
        common = {"pid": PID_SPANS, "tid": 0, "cat": "span", "name": row.name,
                  "id": row.span_id}
        out.append({**common, "ph": "b", "ts": us(row.start_ns),
                    "args": {"trace_id": row.trace_id, **_plain(row.attributes)}})
        out.append({**common, "ph": "e", "ts": us(row.end_ns)})
        counts["spans"] += 1
    out.append(_meta("thread_name", PID_CACHE, TID_MARKS, "violations / events"))
    for df, cat in ((violations, "violation"), (events, "event")):
        for row in df.itertuples(index=False):
            extra = row.details if cat == "violation" else row.attrs
            args = {"seq": None if pd.isna(row.seq) else int(row.seq), **_plain(extra)}
            if cat == "violation":
                args["message"] = row.message
            out.append({"ph": "i", "s": "t", "pid": PID_CACHE, "tid": TID_MARKS,
                        "name": f"{cat}:{row.kind}", "cat": cat, "ts": us(row.ts_ns),
                        "args": args})
            counts["marks"] += 1
    doc = {"traceEvents": out, "displayTimeUnit": "ns",
           "metadata": {"source": str(store_path), "t0_unix_ns": t0}}
    Path(out_path).write_text(json.dumps(doc, default=repr))
    return counts


def _lane(ends: list[int], start: int, end: int) -> int:
    """First lane whose last slice ended by ``start`` (slices on one track must not overlap)."""
    for i, e in enumerate(ends):
        if e <= start:
            ends[i] = end
            return i
    ends.append(end)
    return len(ends) - 1


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def _plain(d: dict) -> dict:
    return {str(k): v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
            for k, v in d.items()}
