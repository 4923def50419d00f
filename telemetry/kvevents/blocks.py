"""Our cache's blocks as KV events see them: hashes, media, groups.

**Block hash.** A block is one page of a node's key. Its hash chains over the pages from the
root: ``h(page) = low 64 bits (big-endian, unsigned) of blake2b-128(parent || extra || tokens)``
where ``parent`` is the previous page's hash as 8 bytes big-endian (``b"radixscope-none-hash"``
for the first page), ``extra`` the node's namespace (``repr`` of its extra key, UTF-8, after a
4-byte length; empty without one) and ``tokens`` the page's ids as little-endian int64. As in
vLLM (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) the wire value is the low 64 bits, unsigned.

**Media** are data: ``TIER_MEDIA`` maps a tier to its medium (device -> ``GPU``, host ->
``CPU``, vLLM's names); the storage tier is published under the medium of its backend kind,
``STORAGE_MEDIA``, in SGLang's ``StorageMedium`` names (``file`` -> ``DISK``, a distributed
store: ``redis`` / ``mooncake`` -> ``EXTERNAL``), or vLLM's generic ``STORAGE`` when the kind
is unknown (``medium_for``). **Groups**: one per block-structured component,
in the cache's component order (``full`` -> group 0 ``full_attention``, ``swa`` -> its own
group ``sliding_window`` with the window); MAMBA state is per node, not per block, and is not
published.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from radixscope.cache.components import KV_SPEC_KINDS, rules
from radixscope.cache.tiers import TIER_LABELS

TIER_MEDIA: dict[str, str] = {"device": "GPU", "host": "CPU"}
_TIER_SLOT = {lbl: i for i, lbl in enumerate(TIER_LABELS)}  # a tier's index in comp.state
STORAGE_MEDIUM = "STORAGE"  # vLLM's MEDIUM_STORAGE: a storage tier of unknown kind
# backend kind (``StorageBackend.name``) -> SGLang's StorageMedium for it
STORAGE_MEDIA: dict[str, str] = {"file": "DISK", "redis": "EXTERNAL", "mooncake": "EXTERNAL"}
STORAGE_MEDIUM_NAMES = ("DISK", "EXTERNAL", STORAGE_MEDIUM)  # media a storage tier may take
SPEC_KINDS: dict[str, str] = KV_SPEC_KINDS  # component -> the spec kind its events carry
NONE_HASH = b"radixscope-none-hash"
MASK64 = (1 << 64) - 1


def backend_kind(name: str) -> str:
    """A backend's kind from its name, wrappers removed (``faulty(gate(file))`` -> ``file``)."""
    while "(" in name and name.endswith(")"):
        name = name[name.index("(") + 1:-1]
    return name


def medium_for(tier: str, backend: str | None = None) -> str:
    """The medium a tier is published as: ``TIER_MEDIA`` for device / host; for the storage
    tier, ``STORAGE_MEDIA`` of the backend's kind, a storage medium name given as is, else
    ``STORAGE``."""
    m = TIER_MEDIA.get(tier)
    if m is not None:
        return m
    if not backend:
        return STORAGE_MEDIUM
    kind = backend_kind(backend)
    if kind.upper() in STORAGE_MEDIUM_NAMES:
        return kind.upper()
    return STORAGE_MEDIA.get(kind.lower(), STORAGE_MEDIUM)


class Group(NamedTuple):
    idx: int
    component: str
    kind: str
    window: int | None


def groups_for(components: Iterable[str], sliding_window: int | None = None) -> list[Group]:
    """The published groups of a cache's components (those with a spec kind)."""
    out: list[Group] = []
    for c in components:
        kind = SPEC_KINDS.get(c)
        if kind is not None:
            out.append(Group(len(out), c, kind, sliding_window if rules(c).has_window else None))
    return out


def _extra_bytes(extra: object) -> bytes:
    if extra is None:
        return b""
    b = repr(extra).encode()
    return struct.pack(">I", len(b)) + b


def page_hashes(parent: int | None, extra: object, tokens: tuple[int, ...] | list[int],
                page_size: int) -> list[int]:
    """The chained hashes of ``tokens``' pages after the page hashed ``parent``."""
    xb = _extra_bytes(extra)
    out: list[int] = []
    prev = NONE_HASH if parent is None else parent.to_bytes(8, "big")
    for i in range(0, len(tokens) - page_size + 1, page_size):
        page = tokens[i:i + page_size]
        d = hashlib.blake2b(prev + xb + struct.pack(f"<{len(page)}q", *page),
                            digest_size=16).digest()
        h = int.from_bytes(d, "big") & MASK64
        out.append(h)
        prev = h.to_bytes(8, "big")
    return out


class Block(NamedTuple):
    hash: int
    parent: int | None
    tokens: tuple[int, ...]


BlockKey = tuple[str, int]  # (medium, group idx)


class NodeHashes:
    """Page hashes of the nodes of a tree replica, memoized (the replica: ``SnapshotBuilder.
    nodes``, ``nid -> [parent, extra_key, tokens, ...]``). ``forget`` a node whose key changed."""

    def __init__(self, nodes: Mapping[int, list], page_size: int) -> None:
        self.nodes = nodes
        self.page_size = page_size
        self.memo: dict[int, list[int]] = {}

    def forget(self, nid: int) -> None:
        self.memo.pop(nid, None)

    def of(self, nid: int) -> list[int]:
        if nid == 0:
            return []
        got = self.memo.get(nid)
        if got is not None:
            return got
        chain = []
        n = nid
        while n and n not in self.memo:
            chain.append(n)
            n = self.nodes[n][0]
        for c in reversed(chain):
            rec = self.nodes[c]
            up = self.memo.get(rec[0]) if rec[0] else None
            last = up[-1] if up else (self._last_before(rec[0]) if rec[0] else None)
            self.memo[c] = page_hashes(last, rec[1], rec[2], self.page_size)
        return self.memo[nid]

    def _last_before(self, nid: int) -> int | None:
        """Hash of the last page at or above ``nid`` (a node with an empty key passes up)."""
        while nid:
            hs = self.memo.get(nid) or self.of(nid)
            if hs:
                return hs[-1]
            nid = self.nodes[nid][0]
        return None

    def parent_hash(self, nid: int) -> int | None:
        p = self.nodes[nid][0]
        return self._last_before(p) if p else None


def node_blocks(nid: int, rec: list, hashes: NodeHashes, comp_index: Mapping[str, int],
                groups: list[Group], tier_media: Mapping[str, str]) -> dict[BlockKey, range]:
    """Which of a node's pages are resident per (medium, group): a page range each.

    A value of ``n`` slots on a tier covers the node's last ``ceil(n / page)`` pages (a whole
    node for FULL; SWA values are whole nodes too, as the cache caps fresh SWA leaves by
    splitting)."""
    npages = len(rec[2]) // hashes.page_size
    out: dict[BlockKey, range] = {}
    states = rec[5]
    ps = hashes.page_size
    for g in groups:
        st = states[comp_index[g.component]]
        for tier, medium in tier_media.items():
            slot = _TIER_SLOT.get(tier)  # a tier the cache does not know: nothing there
            n = st[0][slot] if slot is not None else None
            if n:
                k = min(npages, -(-n // ps))
                if k:
                    out[(medium, g.idx)] = range(npages - k, npages)
    return out


def snapshot_blocks(snap: object, tier_media: Mapping[str, str] | None = None
                    ) -> dict[BlockKey, dict[int, Block]]:
    """Every resident block of a ``CacheSnapshot`` per (medium, group): what the publisher's
    events add up to at that seq (the round-trip tests compare the two)."""
    media = dict(tier_media or TIER_MEDIA)
    comps = snap.components  # type: ignore[attr-defined]
    groups = groups_for(comps)
    ci = {c: i for i, c in enumerate(comps)}
    nodes = {n.node_id: [n.parent_id, n.extra_key, n.tokens, 0, 0,
                         [[s.lens, list(s.refs)] for s in n.components]]
             for n in snap.nodes}  # type: ignore[attr-defined]
    hashes = NodeHashes(nodes, snap.page_size)  # type: ignore[attr-defined]
    out: dict[BlockKey, dict[int, Block]] = {}
    for nid, rec in nodes.items():
        if nid == 0:
            continue
        for key, pages in node_blocks(nid, rec, hashes, ci, groups, media).items():
            add_pages(out.setdefault(key, {}), nid, rec, pages, hashes)
    return out


def add_pages(into: dict[int, Block], nid: int, rec: list, pages: range,
              hashes: NodeHashes) -> None:
    hs = hashes.of(nid)
    ps = hashes.page_size
    toks = rec[2]
    for p in pages:
        parent = hs[p - 1] if p else hashes.parent_hash(nid)
        into[hs[p]] = Block(hs[p], parent, tuple(toks[p * ps:(p + 1) * ps]))
