"""The L3 part of a miss: what the request's prefetch brought back from storage, and why it
stopped, from the cache's ``prefetch`` op records (attrs ``prefetch.reason``,
``prefetch.asked_tokens``, ``prefetch.hit_tokens`` handed back, ``prefetch.found_tokens``
storage reported present, ``prefetch.seconds``; names in ``cache/events.py``).

The explainer adds one reason when the request's last prefetch before the match handed back
less than it asked:

| code           | when                                                                     |
|----------------|--------------------------------------------------------------------------|
| ``in_storage`` | storage held more than the prefetch handed back: "in storage, prefetch   |
|                | stopped at N tokens (deadline after X ms)"                               |
| ``storage_miss``| storage did not hold the rest: "not in storage past N tokens"           |
"""

from __future__ import annotations

import pandas as pd

from radixscope.cache.components import BACKBONE
from radixscope.cache.events import TIER_STORAGE

OP_PREFETCH = "prefetch"  # cache/events.OP_PREFETCH (the hand-back op record)
A_REASON = "prefetch.reason"
A_ASKED = "prefetch.asked_tokens"
A_HIT = "prefetch.hit_tokens"
A_FOUND = "prefetch.found_tokens"
A_SECONDS = "prefetch.seconds"
A_NODE = "node"
IN_STORAGE = "in_storage"
STORAGE_MISS = "storage_miss"
STORAGE_CODES = (IN_STORAGE, STORAGE_MISS)


def _int(v: object, default: int = 0) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def last_prefetch(ops: pd.DataFrame, req_id: str, before_op: int) -> pd.Series | None:
    """The request's last ``prefetch`` op record before op ``before_op`` (None if none)."""
    pf = ops[(ops["op"] == OP_PREFETCH) & (ops["req_id"] == req_id)
             & (ops["op_id"] < before_op)]
    return None if pf.empty else pf.iloc[-1]


def storage_reasons(ops: pd.DataFrame, req_id: str, match_op: int) -> list[dict]:
    """The L3 reason of request ``req_id``'s match at op ``match_op`` (a list of 0 or 1
    ``Reason`` field dicts)."""
    row = last_prefetch(ops, req_id, match_op)
    if row is None:
        return []
    a = row["attrs"] if isinstance(row["attrs"], dict) else {}
    asked, hit = _int(a.get(A_ASKED)), _int(a.get(A_HIT))
    if asked <= 0 or hit >= asked:
        return []
    found = _int(a.get(A_FOUND), -1)
    reason = str(a.get(A_REASON, "unknown"))
    secs = a.get(A_SECONDS)
    ms = f" after {float(secs) * 1e3:.0f} ms" if isinstance(secs, (int, float)) else ""
    node = a.get(A_NODE)
    details = {"reason": reason, "asked_tokens": asked, "hit_tokens": hit,
               "found_tokens": found, "seconds": secs}
    held = f"; storage held {found} of the {asked} tokens asked" if found >= 0 else ""
    if reason == STORAGE_MISS or 0 <= found <= hit:
        code = STORAGE_MISS
        text = (f"not in storage past {hit} tokens: the prefetch (op {int(row['op_id'])}) found "
                f"{max(found, hit)} of the {asked} tokens asked ({reason}{ms})")
    else:
        code = IN_STORAGE
        text = (f"in storage, prefetch stopped at {hit} tokens ({reason}{ms}){held} "
                f"(op {int(row['op_id'])})")
    return [{"code": code, "component": BACKBONE, "tier": TIER_STORAGE,
             "node": node if isinstance(node, int) else None, "seq": int(row["seq_first"]),
             "op_id": int(row["op_id"]), "text": text,
             "details": tuple(sorted(details.items()))}]
