"""What the cache records: one op record per public operation and one mutation per state change.

The cache hands both to the ``Recorder`` it was given (``NullRecorder`` by default, which the
cache never even calls). The hot path builds plain tuples and appends them; sinks in
``telemetry/`` turn them into spans, metrics and the store, off the hot path.

Mutations are *absolute* where they describe a state (``comp.state`` carries the new lengths and
refs, ``pool.available`` the new free count), so replaying them is an overwrite, and
*relative* only for locks (``lock.acquire`` / ``lock.release`` list the nodes whose refs moved by
one). ``cache.snapshot`` applies the same rules, so a replay of the journal reproduces
``HiRadixCache.snapshot()`` exactly.

Mutation tuple layout (also ``Mutation`` below): ``(seq, op_id, kind, node, comp, tier, value)``.

| kind             | node        | comp / tier     | value                                                   |
|------------------|-------------|-----------------|---------------------------------------------------------|
| ``node.create``  | new id      | -               | ``(parent_id, extra_key, tokens)``; ``tokens`` is the   |
|                  |             |                 | node's key itself, an ``array('Q')`` never changed in   |
|                  |             |                 | place (no copy on the hot path; sinks get an array too) |
| ``node.split``   | child id    | -               | ``(new_parent_id, split_len, ref_comps)``: the new node |
|                  |             |                 | takes the child's first ``split_len`` tokens, access    |
|                  |             |                 | and hits, and joins every lock / transfer pinning the   |
|                  |             |                 | child for the components in ``ref_comps``               |
| ``node.delete``  | id          | -               | ``None``: the node leaves the tree with every value it  |
|                  |             |                 | still held; no ``comp.state`` clears them first (a      |
|                  |             |                 | replay drops its last states with it; a journal written |
|                  |             |                 | before schema 6 clears them first, which reads the same)|
| ``node.touch``   | deepest id  | -               | ``tick``: the node and its ancestors (not the root) get |
|                  |             |                 | ``last_access = tick`` and ``hit_count += 1``           |
| ``comp.state``   | id          | comp / -        | ``(lens, refs)``: one entry per tier in ``Tier`` order; |
|                  |             |                 | a length is ``None`` when that tier holds no value, a   |
|                  |             |                 | ref is the pins there (lock ref on device, host ref ...)|
| ``lock.acquire`` | anchor id   | - / tier        | ``(receipt_id, owner, ((comp, (node ids)), ...))``      |
| ``lock.release`` | anchor id   | - / tier        | ``(receipt_id, ((comp, (node ids)), ...), final)``;     |
|                  |             |                 | ``final`` retires the lock (False: partial SWA release) |
| ``pool.available``| -          | comp / tier     | free slots (tokens; states for mamba) after the change  |
| ``transfer.start``| anchor id  | - / dest tier   | ``(transfer_id, kind, node_ids, tokens)``               |
| ``transfer.done`` | anchor id  | - / dest tier   | ``(transfer_id, ok)``                                   |
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from radixscope.cache.tiers import Tier

# ---- op names (public operations) ------------------------------------------------------------
OP_MATCH = "match"
OP_INSERT = "insert"
OP_LOCK = "lock"
OP_UNLOCK = "unlock"
OP_RELEASE_SWA = "release_swa"
OP_ALLOC = "alloc"
OP_FREE = "free"
OP_EVICT = "evict"
OP_EVICT_HOST = "evict_host"
OP_BACKUP = "backup"
OP_LOAD_BACK = "load_back"
OP_TRANSFER = "transfer"  # asynchronous copy; ``attrs['enqueued_by']`` links it to its op
OP_CHECK = "check"
OP_PREFETCH = "prefetch"  # an L3 prefetch handed back (or aborted) into the tree
OP_STORE = "store"  # host -> L3: starts a ``store`` transfer (in poll, once its chain is on host)
OPS = (OP_MATCH, OP_INSERT, OP_LOCK, OP_UNLOCK, OP_RELEASE_SWA, OP_ALLOC, OP_FREE, OP_EVICT,
       OP_EVICT_HOST, OP_BACKUP, OP_LOAD_BACK, OP_TRANSFER, OP_PREFETCH, OP_STORE)

# ---- mutation kinds --------------------------------------------------------------------------
NODE_CREATE = "node.create"
NODE_SPLIT = "node.split"
NODE_DELETE = "node.delete"
NODE_TOUCH = "node.touch"
COMP_STATE = "comp.state"
LOCK_ACQUIRE = "lock.acquire"
LOCK_RELEASE = "lock.release"
POOL_AVAILABLE = "pool.available"
TRANSFER_START = "transfer.start"
TRANSFER_DONE = "transfer.done"
MUTATION_KINDS = (NODE_CREATE, NODE_SPLIT, NODE_DELETE, NODE_TOUCH, COMP_STATE, LOCK_ACQUIRE,
                  LOCK_RELEASE, POOL_AVAILABLE, TRANSFER_START, TRANSFER_DONE)

# tiers are named in records by their label (see tiers.py, the one module that lists them)
TIER_DEVICE = Tier.DEVICE.label
TIER_HOST = Tier.HOST.label
TIER_STORAGE = Tier.STORAGE.label

# ---- attribute keys used in op records (telemetry maps them onto span attributes) -----------
A_DEVICE_TOKENS = "device_tokens"
A_HOST_TOKENS = "host_tokens"
A_SWA_HOST_TOKENS = "swa_host_tokens"
A_MAMBA_HOST = "mamba_host"
A_KEY_TOKENS = "key_tokens"
A_NODE = "node"
A_BEST_NODE = "best_node"
A_PREFIX_LEN = "prefix_len"
A_NEW_TOKENS = "new_tokens"
A_RECEIPT = "receipt"
A_OWNER = "owner"
A_FREED_TOKENS = "freed_tokens"
A_FREED = "freed"  # per-component dict rendered as attributes kv_cache.evict.freed.<comp>
A_REQUESTED = "requested"
A_NODES = "nodes"
A_TOKENS = "tokens"
A_BYTES = "bytes"
A_COPY_NS = "copy_ns"  # a CUDA transfer's copies, timed by events on the side stream
A_TRANSFER = "transfer"
A_TRANSFER_KIND = "transfer_kind"
A_ENQUEUED_BY = "enqueued_by"
A_EXTRA_KEY = "extra_key"
A_BRANCH = "branch_len"  # match: the branching point reported; insert: the one filled in;
# None where there is none (``MatchResult.branch_len`` 0)
A_BRANCH_NODE = "branch_node"  # insert: the node ending at the branching point
A_COMPONENT = "component"
# L3: a store transfer's failed pages; a prefetch's hand-back (reasons: prefetch_events.R_*,
# or "drained" for a poll that only freed the leftovers of earlier prefetches)
A_STORAGE_FAILED = "storage.failed_pages"
A_PREFETCH_REASON = "prefetch.reason"
A_PREFETCH_ASKED = "prefetch.asked_tokens"
A_PREFETCH_HIT = "prefetch.hit_tokens"      # tokens handed back into the tree
A_PREFETCH_FOUND = "prefetch.found_tokens"  # tokens storage reported present (agreed)
A_PREFETCH_SECONDS = "prefetch.seconds"
A_PREFETCH_STATUS = "prefetch.status"       # match: started / ongoing / done / declined reason
A_STORAGE_HIT = "storage_tokens"            # match: host-hit tokens a prefetch brought from L3

# ---- op attributes as recorded ----------------------------------------------------------------
# The hot ops record their attributes as a tuple in ``OP_FIELDS[op]`` order (``op_attrs``
# builds them: a tuple costs a fraction of a dict to build and to encode; bench/RESULTS.md,
# issue 17's fourth round); the other ops (transfer acks, prefetch hand-backs, failed ops) record a
# dict. ``attrs_dict`` names either; a match appends its prefetch fields only when one was asked.
OP_FIELDS: dict[str, tuple[str, ...]] = {
    OP_MATCH: (A_KEY_TOKENS, A_DEVICE_TOKENS, A_HOST_TOKENS, A_SWA_HOST_TOKENS, A_MAMBA_HOST,
               A_NODE, A_BEST_NODE, A_EXTRA_KEY, A_BRANCH, A_PREFETCH_STATUS,
               A_PREFETCH_ASKED, A_STORAGE_HIT),
    OP_INSERT: (A_KEY_TOKENS, A_PREFIX_LEN, A_NEW_TOKENS, A_NODE, A_BRANCH, A_BRANCH_NODE),
    OP_LOCK: (A_RECEIPT, A_NODE, A_OWNER, A_NODES),
    OP_UNLOCK: (A_RECEIPT, A_NODE, A_OWNER),
    OP_RELEASE_SWA: (A_RECEIPT, A_NODE, A_OWNER),
    OP_ALLOC: (A_COMPONENT, A_TOKENS),
    OP_FREE: (A_COMPONENT, A_TOKENS),
    OP_EVICT: (A_COMPONENT, A_REQUESTED, A_FREED_TOKENS, A_FREED, A_NODES),
    OP_EVICT_HOST: (A_COMPONENT, A_REQUESTED, A_FREED_TOKENS, A_FREED, A_NODES),
    OP_BACKUP: (A_TRANSFER, A_NODE),
    OP_LOAD_BACK: (A_NODE, A_TRANSFER, A_TOKENS, A_FREED),
}


def attrs_dict(op: str, attrs: Any) -> dict:
    """A recorded op's attributes as a dict (a tuple is named by ``OP_FIELDS[op]``; an op
    without fields names its values by position)."""
    if type(attrs) is dict:
        return attrs
    if not attrs:
        return {}
    if isinstance(attrs, Mapping):
        return dict(attrs)
    fields = OP_FIELDS.get(op)
    if fields is None:
        return {str(i): v for i, v in enumerate(attrs)}
    return dict(zip(fields, attrs, strict=False))  # a match without prefetch: 9 of 12


class Mutation(NamedTuple):
    seq: int
    op_id: int
    kind: str
    node: int | None
    comp: str | None
    tier: str | None
    value: Any


class OpRecord(NamedTuple):
    """One public operation. Times are wall-clock nanoseconds (``time.time_ns``).

    ``context`` is the caller's OpenTelemetry context at call time (``None`` when not
    captured); sinks parent the op's span on it. ``seq_first``..``seq_last`` is the inclusive
    range of mutation seqs the op made (``seq_last < seq_first`` when it made none).
    """

    op_id: int
    op: str
    start_ns: int
    end_ns: int
    req_id: str | None
    context: Any
    seq_first: int
    seq_last: int
    attrs: dict
    error: str | None


def named_op(op: tuple) -> OpRecord:
    """The ``OpRecord`` of an op tuple as the cache records it, its attributes named."""
    return OpRecord(op[0], op[1], op[2], op[3], op[4], op[5], op[6], op[7],
                    attrs_dict(op[1], op[8]), op[9])


class Recorder:
    """Interface the cache records into. ``enabled=False`` makes the cache skip all recording."""

    enabled: bool = False
    capture_context: bool = False

    def attach(self, info: dict, snapshot: Any) -> None:
        """Called once by the cache at construction with its config summary and first snapshot."""

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        """Called once per public operation: ``op`` is a plain tuple in ``OpRecord`` field
        order whose ``attrs`` is a tuple in ``OP_FIELDS`` order for the hot ops (``named_op(op)``
        names it all; plain, because this runs on every op), with the op's mutations (tuples
        in ``Mutation`` order)."""


class NullRecorder(Recorder):
    """The default: records nothing, costs nothing."""


NULL_RECORDER = NullRecorder()


class FlightRecorder(Recorder):
    """Bounded in-memory rings of the latest op records and mutations (the flight recorder).

    Appending is the only work on the hot path. ``tail()`` copies the rings for a crash bundle.
    Subclasses (telemetry sinks) may override ``record`` and call ``super().record``.
    """

    enabled = True

    def __init__(self, capacity: int = 65536, capture_context: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"FlightRecorder capacity={capacity!r}: must be >= 1")
        self.capacity = capacity
        self.capture_context = capture_context
        self.ops: collections.deque[tuple] = collections.deque(maxlen=capacity)  # OpRecord order
        self.mutations: collections.deque[tuple] = collections.deque(maxlen=capacity * 4)
        self.info: dict = {}
        self.initial_snapshot: Any = None
        self._lock = threading.Lock()

    def attach(self, info: dict, snapshot: Any) -> None:
        self.info = dict(info)
        self.initial_snapshot = snapshot

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        self.ops.append(op)
        if mutations:
            self.mutations.extend(mutations)

    def tail(self, n_ops: int | None = None) -> tuple[list[OpRecord], list[Mutation]]:
        """Copy of the last ``n_ops`` op records and every mutation still in the ring."""
        with self._lock:
            ops = [named_op(o) for o in self.ops]
            muts = [Mutation._make(m) for m in list(self.mutations)]
        if n_ops is not None:
            ops = ops[-n_ops:]
        return ops, muts
