"""The doctor's L3 part: stuck prefetches and leaked host pins, in plain words.

Pure functions over a ``CacheSnapshot`` and a table of pending prefetches, which comes from
``cache.pending_prefetches()`` (live; a crash bundle's ``prefetches`` info row) or from a
store's events (``prefetch.start`` without its ``prefetch.end``, put there by the prefetch
observer). Two findings:

- **stuck prefetch** (warning): started, never handed back, and older than its policy budget
  (``PrefetchConfig.budget_s``: 1 s + 0.25 s per 1024 tokens by default) at the time the
  snapshot was taken;
- **leaked host pin** (error): a host lock whose owner is a finished prefetch
  (``prefetch:<req>`` while that request has no pending prefetch) or a finished store transfer
  (``store:<tid>`` while that transfer is not in flight).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from radixscope.cache import events as ev
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.cache.storage.prefetch_policy import PrefetchConfig
from radixscope.telemetry.analysis.doctor import ERROR, WARNING, Finding

PREFETCH_OWNER = "prefetch:"  # host pin of a running prefetch's anchor (cache/l3_prefetch.py)
STORE_OWNER = "store:"        # host pin of a store transfer's sources (cache/l3_writes.py)
STORE_KIND = "store"          # the transfer kind of a host -> L3 write
PENDING_COLUMNS = ("req_id", "status", "asked_tokens", "completed_tokens", "started_ns",
                   "anchor")
_INTS = ("asked_tokens", "completed_tokens", "started_ns")
EV_START, EV_END = "prefetch.start", "prefetch.end"


def pending_frame(rows: Iterable[object]) -> pd.DataFrame:
    """Pending prefetches as a frame (``PENDING_COLUMNS``) from ``PrefetchState`` objects or
    dicts with those fields (a bundle's untrusted JSON: shape checked).

    Raises:
        ValueError: a row that is not a mapping / object with a string ``req_id`` and integer
            token counts and start time, naming the row.
    """
    out = []
    for i, r in enumerate(rows):
        d = r if isinstance(r, Mapping) else getattr(r, "__dict__", None)
        if d is None and hasattr(r, "__dataclass_fields__"):
            d = {k: getattr(r, k) for k in r.__dataclass_fields__}  # type: ignore[union-attr]
        if not isinstance(d, Mapping) or not isinstance(d.get("req_id"), str) or not all(
                isinstance(d.get(k), int) and not isinstance(d.get(k), bool) for k in _INTS):
            raise ValueError(f"pending prefetch {i}: {str(r)[:120]!r} is not a prefetch state "
                             f"(req_id str, {', '.join(_INTS)} ints)")
        anchor = d.get("anchor")
        out.append((d["req_id"], str(d.get("status", "ongoing")), d["asked_tokens"],
                    d["completed_tokens"], d["started_ns"],
                    anchor if isinstance(anchor, int) and not isinstance(anchor, bool)
                    else None))
    df = pd.DataFrame(out, columns=list(PENDING_COLUMNS))
    df["anchor"] = df["anchor"].astype("Int64")
    return df


def pending_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """Prefetches a store's events show started and not ended (in start order)."""
    open_: dict[str, dict] = {}
    for kind, ts, attrs in zip(events.get("kind", []), events.get("ts_ns", []),
                               events.get("attrs", []), strict=True):
        a = attrs if isinstance(attrs, dict) else {}
        req = a.get("req_id")
        if not isinstance(req, str):
            continue
        if kind == EV_START and a.get("reason") == "started":
            open_[req] = {"req_id": req, "status": "ongoing",
                          "asked_tokens": int(a.get("tokens") or 0), "completed_tokens": 0,
                          "started_ns": int(ts), "anchor": None}
        elif kind == EV_END:
            open_.pop(req, None)
    return pending_frame(open_.values())


def storage_findings(snap: CacheSnapshot, pending: pd.DataFrame, now_ns: int,
                     config: PrefetchConfig | None = None) -> list[Finding]:
    """Stuck prefetches and leaked host pins (module docstring), errors first.

    Args:
        snap: the cache state (its locks and transfers in flight).
        pending: ``pending_frame`` / ``pending_from_events`` rows at the same moment.
        now_ns: wall-clock time of the snapshot (a prefetch's age is ``now_ns - started_ns``).
        config: the prefetch policy's budget (default ``PrefetchConfig()``).
    """
    cfg = config or PrefetchConfig()
    out: list[Finding] = []
    running = set(pending["req_id"])
    flying = {t.transfer_id for t in snap.transfers if t.kind == STORE_KIND}
    for lk in snap.locks:
        owner = lk.owner if isinstance(lk.owner, str) else ""
        if lk.tier != ev.TIER_HOST:
            continue
        nodes = sorted({i for _c, ids in lk.pins for i in ids})
        if owner.startswith(PREFETCH_OWNER) and owner[len(PREFETCH_OWNER):] not in running:
            out.append(Finding(ERROR, f"lock {lk.receipt_id}", f"leaked host pin: {owner!r} "
                               f"still pins node {lk.anchor} ({len(nodes)} nodes) but that "
                               "prefetch is finished: its host copies can never be evicted"))
        elif owner.startswith(STORE_OWNER):
            tid = owner[len(STORE_OWNER):]
            if not tid.isdigit() or int(tid) not in flying:
                out.append(Finding(ERROR, f"lock {lk.receipt_id}", f"leaked host pin: "
                                   f"{owner!r} still pins node {lk.anchor} ({len(nodes)} "
                                   "nodes) but that store transfer is finished"))
    page = max(1, snap.page_size)
    for r in pending.itertuples(index=False):
        budget = cfg.budget_s(-(-int(r.asked_tokens) // page), page)
        age = (now_ns - int(r.started_ns)) / 1e9
        if age > budget:
            out.append(Finding(WARNING, f"prefetch {r.req_id}", f"stuck prefetch: started "
                               f"{age:.1f} s ago for {r.asked_tokens} tokens "
                               f"({r.completed_tokens} landed), never handed back; its "
                               f"{cfg.policy.value} budget is {budget:.2f} s"))
    return sorted(out, key=lambda f: f.severity != ERROR)


def storage_words(pending: pd.DataFrame, found: list[Finding]) -> list[str]:
    """The doctor's L3 lines: pending prefetches, then each finding."""
    lines = [f"storage: {len(pending)} prefetch{'es' if len(pending) != 1 else ''} pending"]
    lines += [f"  {f.severity.upper()} {f.subject}: {f.message}" for f in found]
    return lines
