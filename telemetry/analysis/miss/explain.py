"""The miss explainer: why a request's match stopped where it did, per component and tier.

``explain_miss(source, req_id)`` takes a crash bundle or a store (``telemetry.analysis.load``),
finds the request's ``match`` op, rebuilds the tree just before it (``state_at``), re-runs the
match walk on it (``telemetry/analysis/miss/walk.py``) and, for every component that stopped the match
short of the key, looks up in the journal (``telemetry/analysis/miss/history.py``) what removed the data and
when. Each finding is a ``Reason``:

| code                 | meaning                                                                 |
|----------------------|-------------------------------------------------------------------------|
| ``page_alignment``   | tokens short of a whole page: the key's tail, or a common prefix with a |
|                      | node that ends mid-page (matches keep whole pages only)                 |
| ``namespace_mismatch``| another namespace (extra key) holds more of this key                   |
| ``evicted``          | the data was there and was evicted: node X at seq N by op (req); tier   |
|                      | ``device`` = a host copy remains (load-back), ``host`` = gone           |
| ``swa_tombstone``    | the sliding window behind the match end crosses a tombstoned SWA node   |
| ``swa_pressure``     | that SWA window was tombstoned under SWA pressure (node X at seq N by   |
|                      | op), FULL still resident on device: an insert of the prefix heals it    |
| ``no_mamba_state``   | no MAMBA state at the node where the match would end                    |
| ``not_cached``       | no node ever held the rest of the key in this namespace (in the window) |
| ``in_storage``       | the rest was in L3 storage and the request's prefetch stopped short:    |
|                      | "in storage, prefetch stopped at N tokens (deadline after X ms)"        |
| ``storage_miss``     | the request's prefetch found no more of the key in L3 storage           |

``tier`` is the deepest tier the data is missing from: ``device`` (a host copy exists) or
``host`` (on neither tier); ``storage`` for the L3 reasons (``miss/storage.py``, from the
request's last ``prefetch`` op record before the match). The key comes from ``tokens=``, else a ``request`` event carrying
``tokens`` for the request, else the longest key the request itself inserted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from radixscope.cache import events as ev
from radixscope.telemetry.analysis.miss import walk as st
from radixscope.telemetry.analysis.miss.history import KeyHistory
from radixscope.telemetry.analysis.miss.storage import STORAGE_CODES, storage_reasons
from radixscope.telemetry.analysis.miss.why import Why

PAGE_ALIGNMENT = "page_alignment"
NAMESPACE_MISMATCH = "namespace_mismatch"
EVICTED = "evicted"
SWA_TOMBSTONE = "swa_tombstone"
SWA_PRESSURE = "swa_pressure"
NO_MAMBA_STATE = "no_mamba_state"
NOT_CACHED = "not_cached"
REASON_CODES = (PAGE_ALIGNMENT, NAMESPACE_MISMATCH, EVICTED, SWA_TOMBSTONE, SWA_PRESSURE,
                NO_MAMBA_STATE, NOT_CACHED, *STORAGE_CODES)
REQUEST_EVENT = "request"  # an event whose attrs carry {"req_id", "tokens"}: the explainer's key
MATCH_KEY_ATTR = "key"  # the match op's own key, when the cache records it in the op's attrs


@dataclass(frozen=True)
class Reason:
    """One cause of a short match. ``details`` are ``(name, value)`` pairs (see ``detail``)."""

    code: str
    component: str
    tier: str
    node: int | None
    seq: int | None
    op_id: int | None
    text: str
    details: tuple[tuple[str, object], ...] = ()

    def detail(self) -> dict:
        return dict(self.details)


@dataclass(frozen=True)
class MissExplanation:
    """Why one match of ``req_id`` returned what it did.

    ``device_len``: tokens the match gave on device (as recorded); ``host_len``: the prefix it
    gave on device-or-host (the load-back anchor's); ``full_len``: tokens FULL alone holds on
    either tier. ``consistent`` is False when re-running the match on the rebuilt tree does not
    give the recorded device length (a journal gap, or a bug). ``branch_len``: the branching
    point the match reported (FULL matched past what SWA / MAMBA accept; 0: none);
    ``branch_filled_by`` / ``branch_node``: the request's later insert that passed it and the
    node it ended there (None: no insert of the request filled it in, so the next request over
    this prefix stops short at the same place).
    """

    req_id: str
    op_id: int
    seq: int
    extra_key: object
    key_len: int
    device_len: int
    host_len: int
    full_len: int
    tokens_source: str
    consistent: bool
    reasons: tuple[Reason, ...]
    branch_len: int = 0
    branch_filled_by: int | None = None
    branch_node: int | None = None

    @property
    def hit(self) -> bool:
        return self.device_len == self.key_len and not self.reasons

    def codes(self) -> list[tuple[str, str, str]]:
        """``(code, component, tier)`` per reason, in order."""
        return [(r.code, r.component, r.tier) for r in self.reasons]

    def text(self) -> str:
        head = (f"request {self.req_id}: match (op {self.op_id}, seq {self.seq}) got "
                f"{self.device_len} of {self.key_len} tokens on device, {self.host_len} with "
                f"a load-back from host")
        if self.hit:
            return head + ": a full hit."
        lines = [head + ":"] + [f"  - [{r.component}/{r.tier}] {r.text}" for r in self.reasons]
        if self.branch_len:
            lines.append(self._branch_text())
        if not self.consistent:
            lines.append("  ! re-running the match on the rebuilt tree does not give the "
                         "recorded device length: the journal may have a gap")
        return "\n".join(lines)

    def _branch_text(self) -> str:
        head = (f"  branching point at {self.branch_len} tokens (FULL matched past what SWA / "
                "MAMBA accept): ")
        if self.branch_filled_by is None:
            return head + ("no later insert of this request filled it in (pass "
                           "MatchResult.branch_len to insert); the next request over this "
                           "prefix stops short here again")
        return head + (f"insert op {self.branch_filled_by} kept the SWA window / MAMBA state "
                       f"there (node {self.branch_node})")

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"code": r.code, "component": r.component, "tier": r.tier,
                              "node": r.node, "seq": r.seq, "op_id": r.op_id, "text": r.text}
                             for r in self.reasons],
                            columns=["code", "component", "tier", "node", "seq", "op_id", "text"])


def explain_miss(source, req_id: str, *, tokens: Sequence[int] | None = None,
                 op_id: int | None = None, lookback: int = 200_000) -> MissExplanation:
    """Explain the match of request ``req_id`` (its last one, or op ``op_id``).

    Args:
        source: a ``PostmortemReader`` (``telemetry.analysis.load.load``) or any reader with
            ``ops``, ``events``, ``keyframes``, ``keyframe``, ``journal`` and ``state_at``.
        req_id: the request.
        tokens: the key as given to ``match_prefix`` (default: found in the recording).
        op_id: which of the request's match ops (default: its last).
        lookback: most mutations scanned back for what evicted the data.

    Returns:
        The ``MissExplanation``.

    Raises:
        ValueError: no such request / op, or its key cannot be found (pass ``tokens``).
    """
    ops = source.ops()
    matches = ops[(ops["op"] == ev.OP_MATCH) & (ops["req_id"] == req_id)]
    if op_id is not None:
        matches = matches[matches["op_id"] == op_id]
    if matches.empty:
        have = sorted(set(ops.loc[ops["op"] == ev.OP_MATCH, "req_id"].dropna()))[:10]
        what = f"match op {op_id}" if op_id is not None else "match op"
        raise ValueError(f"request {req_id!r} has no {what} in {source.path!r}; requests with "
                         f"matches: {have}")
    row = matches.iloc[-1]
    attrs = row["attrs"]
    k_len = int(attrs[ev.A_KEY_TOKENS])
    ns = attrs.get(ev.A_EXTRA_KEY)
    before = int(row["seq_first"]) - 1
    snap = source.state_at(before)  # first: says so when the window cannot reach the match
    raw, src = _tokens(source, ops, row, k_len, tokens)
    key = tuple(raw[:k_len])
    tree = st.SnapTree(snap)
    walk = tree.walk(key, ns)
    hist = _history(source, before, key, ns, lookback)
    names = {int(o): (p, r) for o, p, r in zip(ops["op_id"], ops["op"], ops["req_id"],
                                               strict=True)}
    window = int((source.config() if hasattr(source, "config") else {}).get("sliding_window")
                 or 0)
    why = Why(tree, walk, key, ns, window, hist, names, raw_len=len(raw))
    found = why.reasons()
    if int(attrs[ev.A_DEVICE_TOKENS]) < k_len:
        found += storage_reasons(ops, req_id, int(row["op_id"]))
    branch = int(attrs.get(ev.A_BRANCH) or 0)
    filled_by, branch_node = _branch_fill(ops, req_id, int(row["op_id"]), branch)
    return MissExplanation(
        req_id=req_id, op_id=int(row["op_id"]), seq=int(row["seq_first"]), extra_key=ns,
        key_len=k_len, device_len=int(attrs[ev.A_DEVICE_TOKENS]),
        host_len=why.length(why.comb_host),
        full_len=why.length(why.full_host), tokens_source=src,
        consistent=why.length(why.comb_dev) == int(attrs[ev.A_DEVICE_TOKENS]),
        reasons=tuple(Reason(**r) for r in found), branch_len=branch,
        branch_filled_by=filled_by, branch_node=branch_node)


def _branch_fill(ops: pd.DataFrame, req_id: str, match_op: int,
                 branch: int) -> tuple[int | None, int | None]:
    """The first insert of ``req_id`` after op ``match_op`` that filled in the branching point
    ``branch`` (its op id and branch node), or (None, None)."""
    if not branch:
        return None, None
    ins = ops[(ops["op"] == ev.OP_INSERT) & (ops["req_id"] == req_id)
              & (ops["op_id"] > match_op)]
    for op_id, a in zip(ins["op_id"], ins["attrs"], strict=True):
        if a.get(ev.A_BRANCH) == branch and a.get(ev.A_BRANCH_NODE) is not None:
            return int(op_id), int(a[ev.A_BRANCH_NODE])
    return None, None


def explain_requests(source, req_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per request with a match: lengths, reason codes and the explanation text (or the
    reason it could not be explained)."""
    ops = source.ops()
    if req_ids is None:
        req_ids = list(dict.fromkeys(ops.loc[ops["op"] == ev.OP_MATCH, "req_id"].dropna()))
    rows = []
    for rid in req_ids:
        try:
            x = explain_miss(source, rid)
        except ValueError as e:
            rows.append({"req_id": rid, "op_id": None, "key_len": None, "device_len": None,
                         "host_len": None, "branch_len": None, "reasons": "",
                         "text": f"not explained: {e}"})
            continue
        rows.append({"req_id": rid, "op_id": x.op_id, "key_len": x.key_len,
                     "device_len": x.device_len, "host_len": x.host_len,
                     "branch_len": x.branch_len,
                     "reasons": ", ".join(f"{c}({comp}/{t})" for c, comp, t in x.codes()),
                     "text": x.text()})
    df = pd.DataFrame(rows, columns=["req_id", "op_id", "key_len", "device_len", "host_len",
                                     "branch_len", "reasons", "text"])
    for c in ("op_id", "key_len", "device_len", "host_len", "branch_len"):
        df[c] = df[c].astype("Int64")
    return df


def _tokens(source, ops: pd.DataFrame, row: pd.Series, k_len: int,
            given: Sequence[int] | None) -> tuple[tuple[int, ...], str]:
    """The match's key: given; recorded with the op; a ``request`` event; the path to the
    match's best node when that covers the whole key; the longest key the request inserted."""
    req_id, attrs = row["req_id"], row["attrs"]
    if given is not None:
        toks = tuple(int(t) for t in given)
        if len(toks) < k_len:
            raise ValueError(f"tokens has {len(toks)} entries but request {req_id!r} matched a "
                             f"key of {k_len} tokens")
        return toks, "given"
    if isinstance(attrs.get(MATCH_KEY_ATTR), list | tuple):
        return tuple(int(t) for t in attrs[MATCH_KEY_ATTR]), "match op"
    best = attrs.get(ev.A_BEST_NODE)
    if isinstance(best, int) and best != 0:
        toks = _path_at(source, int(row["seq_last"]), best)
        if toks is not None and len(toks) == k_len:
            return toks, "match op best node"
    evs = source.events(kind=REQUEST_EVENT) if hasattr(source, "events") else pd.DataFrame()
    for attrs in reversed(list(evs.get("attrs", []))):
        if attrs.get("req_id") == req_id and len(attrs.get("tokens") or ()) >= k_len:
            return tuple(int(t) for t in attrs["tokens"]), "request event"
    ins = ops[(ops["op"] == ev.OP_INSERT) & (ops["req_id"] == req_id)]
    for _, r in ins.sort_values("seq_last", ascending=False).iterrows():
        a = r["attrs"]
        if int(a.get(ev.A_KEY_TOKENS, 0)) < k_len or a.get(ev.A_NODE) is None:
            continue
        toks = _path_at(source, int(r["seq_last"]), int(a[ev.A_NODE]))
        if toks is not None and len(toks) >= k_len:
            return toks, f"insert op {int(r['op_id'])}"
    raise ValueError(f"request {req_id!r}: its key is not in {source.path!r} (no '{REQUEST_EVENT}' "
                     "event with its tokens and no insert by it in the window); pass tokens=")


def _path_at(source, seq: int, node: int) -> tuple[int, ...] | None:
    """Tokens from the root to ``node`` in the tree at ``seq`` (None if not rebuildable)."""
    try:
        tree = st.SnapTree(source.state_at(seq))
    except ValueError:
        return None
    return tree.path_tokens(node) if node in tree.by_id else None


def _history(source, before: int, key: tuple[int, ...], ns: object,
             lookback: int) -> KeyHistory | None:
    kfs = [int(s) for s in source.keyframes()["seq"] if int(s) <= before]
    if not kfs:
        return None
    recent = [s for s in kfs if s >= before - lookback]
    start_seq = min(recent) if recent else max(kfs)
    return KeyHistory(source.keyframe(start_seq), source.journal(start_seq + 1, before), key, ns)
