"""The miss explainer's L3 reasons, from ``prefetch`` op records (cache/events A_PREFETCH_*)."""

from __future__ import annotations

import pandas as pd

from radixscope.cache import events as ev
from radixscope.telemetry.analysis.miss import storage as ms
from radixscope.telemetry.analysis.miss.explain import REASON_CODES

COLS = ["op_id", "op", "start_ns", "end_ns", "req_id", "seq_first", "seq_last", "attrs"]


def ops(*rows) -> pd.DataFrame:
    """Op rows in the store's ``ops()`` shape (attrs as dicts)."""
    return pd.DataFrame([dict(zip(COLS, r, strict=True)) for r in rows], columns=COLS)


def pf(op_id, req, reason, asked, hit, found, secs, node=7):
    return (op_id, "prefetch", 0, 0, req, 100 + op_id, 99 + op_id,
            {ms.A_REASON: reason, ms.A_ASKED: asked, ms.A_HIT: hit, ms.A_FOUND: found,
             ms.A_SECONDS: secs, ms.A_NODE: node})


def test_record_keys_are_the_caches():
    for name, key in (("OP_PREFETCH", ms.OP_PREFETCH), ("A_PREFETCH_REASON", ms.A_REASON),
                      ("A_PREFETCH_ASKED", ms.A_ASKED), ("A_PREFETCH_HIT", ms.A_HIT),
                      ("A_PREFETCH_FOUND", ms.A_FOUND), ("A_PREFETCH_SECONDS", ms.A_SECONDS)):
        assert hasattr(ev, name), f"cache/events.py has no {name}"
        assert getattr(ev, name) == key
    assert ms.A_NODE == ev.A_NODE
    assert set(ms.STORAGE_CODES) <= set(REASON_CODES)


def test_prefetch_stopped_by_its_deadline_while_storage_held_more():
    frame = ops(pf(3, "r1", "deadline", 512, 128, 384, 1.25),
                pf(4, "other", "terminated", 512, 0, 512, 0.1))
    (r,) = ms.storage_reasons(frame, "r1", match_op=9)
    assert (r["code"], r["component"], r["tier"], r["node"], r["seq"], r["op_id"]) == (
        ms.IN_STORAGE, "full", "storage", 7, 103, 3)
    assert r["text"] == ("in storage, prefetch stopped at 128 tokens (deadline after 1250 ms); "
                         "storage held 384 of the 512 tokens asked (op 3)")
    assert dict(r["details"])["found_tokens"] == 384


def test_storage_did_not_hold_the_rest():
    frame = ops(pf(3, "r1", "storage_miss", 512, 256, 256, 0.02))
    (r,) = ms.storage_reasons(frame, "r1", match_op=9)
    assert r["code"] == ms.STORAGE_MISS
    assert r["text"] == ("not in storage past 256 tokens: the prefetch (op 3) found 256 of the "
                         "512 tokens asked (storage_miss after 20 ms)")


def test_only_the_last_prefetch_before_the_match_and_only_when_short():
    frame = ops(pf(3, "r1", "deadline", 512, 128, 384, 1.25),
                pf(5, "r1", "complete", 512, 512, 512, 0.3),
                pf(11, "r1", "terminated", 64, 0, 64, 0.01))
    assert ms.storage_reasons(frame, "r1", match_op=9) == []   # op 5: complete
    assert ms.storage_reasons(frame, "r1", match_op=4)[0]["op_id"] == 3
    assert ms.storage_reasons(frame, "r2", match_op=9) == []
    (r,) = ms.storage_reasons(frame, "r1", match_op=12)
    assert r["text"].startswith("in storage, prefetch stopped at 0 tokens (terminated after 10 ms)")
