"""Admission budget: what admitting a request needs per component, against what can be freed.

``need = load_back + prefill`` per component, where load-back counts exactly the device slots
``load_back`` will allocate (FULL ``host_hit_length``; SWA ``swa_host_hit_length``, already
page-rounded, for host-only windows behind the anchor (seed bug class 3); MAMBA one slot per host
state) and prefill counts the first chunk's slots (``ceil_paged(min(extend, chunk))`` for KV
components, one working state slot for MAMBA). ``headroom = free + evictable - own``, where
``own`` is the evictable data on the request's own path that its lock (and the load-back's) will
pin. If ``fits``, the load-back and the first chunk's allocation cannot run out of memory.

With an L3 tier, a match whose prefetch is in flight (``prefetch_status`` started / ongoing)
needs device slots for the prefetched tokens once they load back (``prefetch_load``; they are
not prefilled, so the chunk is taken from the rest of ``extend_len``), and every component
reports the host slots running prefetches hold (``prefetch_host``).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixscope.cache.components import BACKBONE, WINDOW
from radixscope.cache.keys import ceil_paged
from radixscope.cache.results import MatchResult
from radixscope.cache.tiers import DEVICE, HOST


@dataclass(frozen=True)
class ComponentNeed:
    component: str
    unit: str
    capacity: int
    available: int
    evictable: int
    protected: int
    own_pinned: int
    load_back: int
    prefill: int
    prefetch_load: int = 0   # device slots a prefetch in flight will need once loaded
    prefetch_host: int = 0   # host slots held by running prefetches (every request)

    @property
    def headroom(self) -> int:
        return self.available + self.evictable - self.own_pinned

    @property
    def need(self) -> int:
        return self.load_back + self.prefetch_load + self.prefill

    @property
    def fits(self) -> bool:
        return self.need <= self.headroom

    def explain(self) -> str:
        verdict = "fits" if self.fits else "does NOT fit"
        pf = f"prefetched {self.prefetch_load} + " if self.prefetch_load else ""
        return (f"{self.component}: needs {self.need} {self.unit} (load-back {self.load_back} + "
                f"{pf}prefill {self.prefill}); can free {self.headroom} = free {self.available} + "
                f"evictable {self.evictable} - pinned by its own path {self.own_pinned} "
                f"(protected by others: {self.protected}) -> {verdict}")


@dataclass(frozen=True)
class Admission:
    fits: bool
    extend_len: int
    chunk_tokens: int
    components: tuple[ComponentNeed, ...]

    def component(self, name: str) -> ComponentNeed:
        for c in self.components:
            if c.component == name:
                return c
        raise KeyError(f"no component {name!r} in this admission")

    @property
    def reason(self) -> str:
        bad = [c for c in self.components if not c.fits]
        if not bad:
            return "admitted: " + "; ".join(c.explain() for c in self.components)
        return "refused: " + "; ".join(c.explain() for c in bad)

    def as_dict(self) -> dict:
        return {"fits": self.fits, "extend_len": self.extend_len,
                "chunk_tokens": self.chunk_tokens, "reason": self.reason,
                "components": {c.component: {
                    "need": c.need, "load_back": c.load_back, "prefill": c.prefill,
                    "prefetch_load": c.prefetch_load, "prefetch_host": c.prefetch_host,
                    "headroom": c.headroom, "available": c.available, "evictable": c.evictable,
                    "protected": c.protected, "own_pinned": c.own_pinned} for c in self.components}}


class Admitting:
    """The admission budget, as a method of the cache (mixed into ``HiRadixCache``)."""

    def _admission_budget(self, match: MatchResult, extend_len: int, chunk_tokens: int | None) -> Admission:
        if not isinstance(match, MatchResult):
            raise TypeError(f"admission takes a MatchResult, got {type(match).__name__}")
        if isinstance(extend_len, bool) or not isinstance(extend_len, int) or extend_len < 0:
            raise ValueError(f"extend_len={extend_len!r} must be an int >= 0")
        if chunk_tokens is not None and (isinstance(chunk_tokens, bool)
                                         or not isinstance(chunk_tokens, int) or chunk_tokens < 1):
            raise ValueError(f"chunk_tokens={chunk_tokens!r} must be None or an int >= 1")
        # a prefetch in flight (or started by this match) brings its tokens from L3 to host:
        # they load back instead of being prefilled
        pf = match.prefetch_tokens if match.prefetch_status in ("started", "ongoing") else 0
        pf = min(pf, extend_len)
        rest = extend_len - pf
        chunk = rest if chunk_tokens is None else min(rest, chunk_tokens)
        anchor = self.node(match.best_match_node)
        pins, _ = self.lock_pins(anchor)
        page = self.page_size
        out = []
        for comp in self.comps:
            ci = comp.index
            own = sum(comp.size(n.data[ci].values[DEVICE]) for n in pins.get(ci, ())
                      if n.data[ci].values[DEVICE] is not None and n.data[ci].refs[DEVICE] == 0)
            if comp.name == BACKBONE:
                load, pre, unit = match.host_hit_length, ceil_paged(chunk, page), "tokens"
                pf_load = pf
            elif comp.name == WINDOW:
                load, pre, unit = ceil_paged(match.swa_host_hit_length, page), ceil_paged(chunk, page), "tokens"
                pf_load = min(ceil_paged(pf, page), comp.value_cap or 0)
            else:
                load, pre, unit = match.mamba_host_hit_length, 0 if match.mamba_slot is not None else 1, "states"
                pf_load = 0
            alloc = self.device_pools[ci].alloc
            out.append(ComponentNeed(comp.name, unit, alloc.capacity, alloc.available,
                                     self.evictable[ci][DEVICE], self.protected[ci][DEVICE], own,
                                     load, pre, pf_load, self.request_held[ci][HOST]
                                     if self.storage is not None else 0))
        return Admission(all(c.fits for c in out), extend_len, chunk, tuple(out))


__all__ = ["Admission", "Admitting", "ComponentNeed"]
