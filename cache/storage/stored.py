"""``StoredPages``: what a node's STORAGE value is -- the chained page hashes of one component's
pages that are in L3 (the tree holds no L3 slots; L3 is found by hashing).

A KV component's value covers the node's whole key: ``numel()`` is its tokens (pages *
page_size), and ``[:k]`` / ``[k:]`` slice in tokens at page boundaries, so ``Component.split``
splits it like a slot tensor. A MAMBA value is one state keyed by the node's last page hash:
``numel()`` is 1 and it is never sliced (the state stays on the split's child). Immutable.
"""

from __future__ import annotations

from radixscope.cache.storage.keys import HASH_BYTES


class StoredPages:
    """Chained page hashes stored in L3 for one component of one node.

    Args:
        hashes: the 32-byte chained hashes, one per page (a state: exactly one).
        page_size: tokens per page.
        state: a recurrent state (one per node) rather than KV pages.
    """

    __slots__ = ("hashes", "page_size", "state")

    def __init__(self, hashes: tuple[bytes, ...], page_size: int, state: bool = False) -> None:
        hashes = tuple(hashes)
        if not all(isinstance(h, bytes) and len(h) == HASH_BYTES for h in hashes):
            raise ValueError(f"StoredPages: hashes must be {HASH_BYTES}-byte digests")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"StoredPages: page_size={page_size!r} must be an int >= 1")
        if not hashes or (state and len(hashes) != 1):
            raise ValueError(f"StoredPages: {len(hashes)} hashes for a "
                             f"{'state (needs 1)' if state else 'KV value (needs >= 1)'}")
        object.__setattr__(self, "hashes", hashes)
        object.__setattr__(self, "page_size", page_size)
        object.__setattr__(self, "state", bool(state))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"StoredPages is immutable (set {name!r})")

    def numel(self) -> int:
        """Tokens covered (KV), or 1 (a state): what the ledgers count."""
        return 1 if self.state else len(self.hashes) * self.page_size

    @property
    def pages(self) -> int:
        return len(self.hashes)

    @property
    def last(self) -> bytes:
        """The last page's hash (a child's chain continues from it)."""
        return self.hashes[-1]

    def __getitem__(self, s: slice) -> StoredPages:
        if self.state or not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("StoredPages slices KV values by a token range only")
        n = self.numel()
        a, b, _ = s.indices(n)
        p = self.page_size
        if a % p or b % p or b <= a:
            raise ValueError(f"StoredPages[{s.start}:{s.stop}] is not whole pages of {p}")
        return StoredPages(self.hashes[a // p:b // p], p)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StoredPages) and other.hashes == self.hashes
                and other.page_size == self.page_size and other.state == self.state)

    def __hash__(self) -> int:
        return hash((self.hashes, self.page_size, self.state))

    def __repr__(self) -> str:
        kind = "state" if self.state else f"{self.pages} pages"
        return f"StoredPages({kind}, last={self.last.hex()[:12]})"


__all__ = ["StoredPages"]
