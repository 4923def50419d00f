"""Frozen results, receipts and handles returned by the cache. Tuple fields; never mutated."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import torch

from radixscope.cache.native import fill_slots


def _record(cls):
    """``cls`` as a frozen dataclass with ``__slots__`` and an ``__init__`` of the same
    signature that sets all its slots in one native call (``native.fill_slots``).

    Slots, not a ``__dict__``: the interpreter reads a slot with a specialized load that stays
    specialized. A ``__dict__`` filled in ``__init__`` (the frozen ``__setattr__`` forbids
    ``self.x = x``) is a split dict, whose reads CPython 3.11 and 3.12 specialize and then
    de-optimize on every read, so each read of a result's field took the generic lookup: the
    caller's, and the ledger's attribute builders' on every recorded op (issue 17). The
    dataclass's own frozen ``__init__`` calls ``object.__setattr__`` per field (about 4.5 us
    for a ``MatchResult``); this one costs one call. Instances stay frozen (``__setattr__``
    raises) and compare, hash, print, pickle and ``dataclasses.replace`` as dataclasses do.
    Only for plain defaults and no ``__post_init__``."""
    cls = dataclass(frozen=True, slots=True)(cls)
    assert not hasattr(cls, "__post_init__")
    params, names, env = [], [], {"_fill": fill_slots}
    for f in dataclasses.fields(cls):
        assert f.default_factory is dataclasses.MISSING and f.init, f.name
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        names.append(f.name)
    # each field's member descriptor (a subclass's inherited fields live on its base)
    env["_slots"] = tuple(next(k.__dict__[n] for k in cls.__mro__ if n in k.__dict__)
                          for n in names)
    src = (f"def __init__(self, {', '.join(params)}):\n"
           f"    _fill(self, _slots, {', '.join(names)})")
    exec(src, env)  # noqa: S102 - generated from the class's own field names
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    # the dataclass's own frozen __setattr__ / __delattr__ call super() with the class it was
    # given, not the slotted one ``slots=True`` makes, so on a name that is not a field they
    # raise TypeError; nothing has a __dict__ to fall back to: every name is refused alike
    cls.__setattr__ = _refuse_set
    cls.__delattr__ = _refuse_del
    return cls


def _refuse_set(self, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_del(self, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


class TransferId(int):
    """A transfer id: an ``int`` (journal, spans and snapshots see the number) that also carries
    the issuing cache's ``instance``, so ``poll`` of another cache rejects it. Immutable."""

    cache_instance: int

    def __new__(cls, value: int, cache_instance: int = 0) -> TransferId:
        obj = super().__new__(cls, value)
        object.__setattr__(obj, "cache_instance", cache_instance)
        return obj

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TransferId is immutable (set {name!r})")

    def __reduce__(self) -> tuple:
        return (TransferId, (int(self), self.cache_instance))


@_record
class MatchResult:
    """What ``match_prefix`` found.

    Attributes:
        device_indices: FULL device slot indices of the usable device prefix (a fresh tensor).
        device_prefix_len: its length in tokens (page-aligned).
        last_device_node: deepest node every component accepts on device (lock this one).
        last_host_node: deepest node every component accepts on device or host (the L3
            prefetch anchor; equal to ``best_match_node`` here).
        best_match_node: deepest node every component accepts on device or host: the L2
            load-back anchor.
        host_hit_length: FULL tokens a load-back will bring from host.
        swa_host_hit_length: SWA tokens a load-back will bring (host-only SWA in the window
            behind ``best_match_node``, page-rounded, capped at the page-rounded window).
        mamba_host_hit_length: MAMBA states a load-back will bring (0 or 1).
        matched_len: tokens matched on any tier ignoring auxiliary components (FULL only).
        branch_len: the branching point: ``matched_len`` when FULL reaches further than the
            auxiliary components accept (no SWA window / MAMBA state at the FULL match's end,
            typically a shared system prompt another conversation split off), else 0. Pass
            it to ``insert`` (with the MAMBA state at that position as ``mamba_branch_slot``)
            and the next request over this prefix matches up to it. Page-aligned.
        key_len: page-aligned length of the key that was matched.
        mamba_slot: request-owned MAMBA slot holding a copy of the state (``cow_mamba``).
        cache_instance: the issuing cache's ``instance``; another cache rejects the handle.
        prefetch_status: with ``prefetch=True``: ``started``, ``ongoing`` (do not schedule),
            ``done``, or why none started (``below_threshold``, ``rate_limited``,
            ``host_capacity``); ``off`` otherwise (no storage, or not asked).
        prefetch_tokens: tokens asked from L3 by this request's prefetch.
        storage_hit_length: tokens of this match's host hit that a finished prefetch for the
            request brought from L3.

    Readable on return: every slot it names (device indices, the nodes up to
    ``last_device_node``, ``mamba_slot``) holds its data for the caller's stream, even where a
    load-back brought it (see cache/README.md, "Concurrency contract").
    """

    device_indices: torch.Tensor
    device_prefix_len: int
    last_device_node: int
    last_host_node: int
    best_match_node: int
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    mamba_host_hit_length: int = 0
    matched_len: int = 0
    key_len: int = 0
    extra_key: object = None
    branch_len: int = 0
    mamba_slot: torch.Tensor | None = None
    cache_instance: int = 0
    # L3 (fields of ``StorageMatchResult``): plain class attributes here, so a match without
    # a storage tier builds nothing more than before
    prefetch_status = "off"
    prefetch_tokens = 0
    storage_hit_length = 0

    @property
    def needs_load_back(self) -> bool:
        return (self.host_hit_length > 0 or self.swa_host_hit_length > 0
                or self.mamba_host_hit_length > 0)

    @property
    def best_prefix_len(self) -> int:
        """Tokens usable after a load-back: device prefix plus host hits."""
        return self.device_prefix_len + self.host_hit_length


@_record
class StorageMatchResult(MatchResult):
    """A ``MatchResult`` of ``match_prefix(..., prefetch=True)`` on a cache with storage: the
    same fields plus the prefetch's (see ``MatchResult``)."""

    prefetch_status: str = "off"
    prefetch_tokens: int = 0
    storage_hit_length: int = 0

    @classmethod
    def of(cls, m: MatchResult, status: str, tokens: int, hit: int = 0) -> StorageMatchResult:
        return cls(**{f.name: getattr(m, f.name) for f in fields(MatchResult)},
                   prefetch_status=status, prefetch_tokens=tokens, storage_hit_length=hit)


@_record
class InsertResult:
    """``prefix_len``: tokens of the key already in the tree (device or host) before the insert;
    the caller's slots for that part were freed, except below ``prev_prefix_len``.
    ``last_node``: the node ending at the inserted key. ``mamba_exist``: the tree already held
    a state there, so the donated MAMBA slot was freed. ``branch_node``: the node ending at
    ``branch_len`` (None without one); ``mamba_branch_exist``: it already held a MAMBA state,
    so ``mamba_branch_slot`` was freed."""

    prefix_len: int
    last_node: int
    key_len: int
    new_tokens: int
    mamba_exist: bool = False
    backups: tuple[TransferId, ...] = ()
    branch_node: int | None = None
    mamba_branch_exist: bool = False


@_record
class LockReceipt:
    """Proof of a lock. ``unlock`` replays the pins the cache keeps under ``receipt_id``.

    ``skipped`` lists the FULL-evicted bottom segment (host-only nodes below the deepest device
    node) that the lock did not pin; ``pins`` the nodes pinned per component at lock time.
    """

    receipt_id: int
    anchor: int
    owner: str | None
    tier: str
    pins: tuple[tuple[str, tuple[int, ...]], ...]
    skipped: tuple[int, ...] = ()
    swa_released: bool = False
    cache_instance: int = 0


@_record
class EvictResult:
    """What ``evict`` / ``evict_host`` freed of ``component`` (``requested`` slots asked),
    per component, and the nodes it took, in order."""

    requested: int
    freed: tuple[tuple[str, int], ...]  # per component, slots freed on this tier
    evicted_nodes: tuple[int, ...]      # nodes deleted or demoted, in eviction order
    demoted: tuple[int, ...] = ()       # nodes that became host-only
    deleted: tuple[int, ...] = ()       # nodes removed from the tree
    tombstoned: tuple[tuple[str, int], ...] = ()  # (component, node): data dropped, FULL kept
    component: str | None = None  # the component asked for (the cache's results name it)

    def freed_of(self, component: str) -> int:
        return dict(self.freed).get(component, 0)


@dataclass(frozen=True)
class LoadBackResult:
    anchor: int
    device_indices: torch.Tensor   # FULL device indices of the whole prefix up to the anchor
    device_prefix_len: int
    loaded: tuple[tuple[str, int], ...]  # per component, slots loaded
    transfer_id: TransferId | None
    mamba_slot: torch.Tensor | None = None
    cache_instance: int = 0

    def loaded_of(self, component: str) -> int:
        return dict(self.loaded).get(component, 0)


@dataclass(frozen=True)
class PoolCopy:
    """One copy between pools: ``src`` slots of (component, src tier) into ``dst`` slots."""

    component: str
    src_tier: str
    dst_tier: str
    src: torch.Tensor
    dst: torch.Tensor


# transfer kind -> the tier it writes (``store``: host -> L3, run by the storage writer)
_DST_TIER = {"backup": "host", "load_back": "device", "store": "storage"}


@dataclass(frozen=True)
class Transfer:
    """An asynchronous copy job. Never mutated: moving indices makes a new object
    (``dataclasses.replace``), so the tree's own tensors are never touched by a transfer."""

    transfer_id: int
    kind: str             # "backup" (device -> host), "load_back" (host -> device), "store"
    anchor: int
    node_ids: tuple[int, ...]
    copies: tuple[PoolCopy, ...]
    enqueued_by: int      # op_id of the operation that created it
    receipts: tuple[int, ...] = ()
    created_ns: int = 0
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def dst_tier(self) -> str:
        return _DST_TIER[self.kind]

    def amounts(self) -> tuple[tuple[str, int], ...]:
        out: dict[str, int] = {}
        for c in self.copies:
            out[c.component] = out.get(c.component, 0) + c.src.numel()
        return tuple(out.items())
