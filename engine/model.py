"""A deterministic stand-in model: KV and recurrent state as pure functions of the token prefix.

Nothing here is learned. Position ``i`` of a sequence gets a *prefix hash* (a pair of polynomial
hashes of ``tokens[:i + 1]`` modulo two primes, salted by the namespace), and every value the
model writes there (FULL KV, SWA KV, MAMBA state) is derived from that pair with per-component
constants. So the content a pool slot *should* hold for a prefix can be recomputed at any time,
and the engine checks every matched or loaded prefix bit for bit (``verify_*``): data loss in
eviction, backup or load-back is caught instead of assumed away. All of it is vectorised.
"""

from __future__ import annotations

import torch

from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.config import CacheConfig
from radixscope.engine.uploads import PinnedUploads

M1, P1 = 2_147_483_647, 1_000_003  # two 31-bit primes and bases: a 62-bit prefix hash
M2, P2 = 2_147_483_629, 999_983
_SALTS = {BACKBONE: 11, WINDOW: 23, STATE: 37}


class ContentMismatch(RuntimeError):
    """A pool slot does not hold what the stand-in model wrote for that prefix position."""

    rule = "content.verify"

    def __init__(self, req_id: str, component: str, position: int, slot: int, what: str) -> None:
        self.req_id = req_id
        self.component = component
        self.position = position
        self.slot = slot
        super().__init__(f"content mismatch in request {req_id}: {component} {what} at token "
                         f"position {position} (slot {slot}) is not what the model wrote for "
                         "that prefix")


class _Powers:
    """``P**j mod M`` for j < n, grown by doubling (products stay below 2**62)."""

    def __init__(self, p: int, m: int) -> None:
        self.m = m
        self.table = torch.tensor([1, p % m], dtype=torch.int64)

    def upto(self, n: int) -> torch.Tensor:
        while self.table.numel() < n:
            step = int(self.table[-1]) * int(self.table[1]) % self.m  # P**len(table)
            self.table = torch.cat([self.table, self.table * step % self.m])
        return self.table[:n]


_POW1, _POW2 = _Powers(P1, M1), _Powers(P2, M2)


def namespace_salt(extra_key: object) -> int:
    """A stable salt for a namespace (``hash()`` of a str is randomised per process)."""
    if extra_key is None:
        return 0
    s = str(extra_key).encode()
    h = 0
    for b in s:
        h = (h * 131 + b + 1) % M2
    return h + 1


def prefix_hashes(tokens: torch.Tensor, extra_key: object = None) -> torch.Tensor:
    """``[n, 2]`` int64: row ``i`` is the hash pair of ``tokens[:i + 1]`` in ``extra_key``."""
    t = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    n = t.numel()
    if n == 0:
        return torch.empty((0, 2), dtype=torch.int64)
    salt = namespace_salt(extra_key)
    t1 = (t % M1 + 1) * _POW1.upto(n) % M1
    t2 = (t % M2 + 1) * _POW2.upto(n) % M2
    h1 = (torch.cumsum(t1, 0) + salt) % M1
    h2 = (torch.cumsum(t2, 0) + salt) % M2
    return torch.stack([h1, h2], dim=1)


class StandInModel:
    """Writes and verifies KV / state content for one cache configuration.

    KV values are computed directly in the pool's layout, viewed as ``[layers * 2, slots,
    heads * head_dim]`` (so no permutes), as 24-bit fractions that every float dtype of the pools
    reproduces identically. They are computed on the pools' device (on CUDA, kernels on the
    compute stream, beside the side stream's copies), and checked there; on CUDA the hashes
    and slot lists go there through reused pinned buffers (``PinnedUploads``), so an upload
    does not wait for the stream to drain.

    Args:
        config: the cache configuration (pool shapes, dtype, sliding window).
    """

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.dtype = config.dtype
        self.window = config.sliding_window
        shapes: dict[str, tuple[int, int]] = {BACKBONE: (config.layers * 2,
                                                       config.heads * config.head_dim)}
        if WINDOW in config.components:
            shapes[WINDOW] = (config.swa_layers * 2, config.heads * config.head_dim)
        if STATE in config.components:
            size = 1
            for d in config.mamba_state_shape:
                size *= d
            shapes[STATE] = (1, size)
        self.device = torch.device(config.device)
        self._uploads = PinnedUploads(self.device) if self.device.type == "cuda" else None
        self._consts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for comp, (rows, cols) in shapes.items():
            g = torch.Generator().manual_seed(_SALTS[comp])
            self._consts[comp] = tuple(  # type: ignore[assignment]
                torch.randint(1, 1 << 30, (rows, 1, cols), generator=g,
                              dtype=torch.int64).to(self.device)
                for _ in range(3))

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the pools' device (CUDA: queued from pinned memory; CPU: ``t`` itself)."""
        return t if self._uploads is None else self._uploads.put(t)

    # ---- content -------------------------------------------------------------------------
    def values(self, comp: str, hashes: torch.Tensor) -> torch.Tensor:
        """``[rows, n, cols]`` values of ``comp`` at the positions whose prefix hashes are
        ``hashes`` (rows = layers x (k, v) for KV, 1 for MAMBA), on the pools' device."""
        a, b, d = self._consts[comp]
        hashes = self._on_device(hashes)
        h1 = hashes[:, 0].contiguous().view(1, -1, 1)
        h2 = hashes[:, 1].contiguous().view(1, -1, 1)
        raw = h1 * a  # < 2**61: the sum below stays under 2**63, so nothing overflows
        raw += h2 * b
        raw += d
        raw >>= 8
        raw &= 0xFFFFFF
        out = raw.to(torch.float32)
        out.mul_(1.0 / (1 << 24)).sub_(0.5)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def state(self, hash_row: torch.Tensor) -> torch.Tensor:
        """MAMBA state after the prefix whose hash pair is ``hash_row`` (``[1, *state_shape]``)."""
        return self.values(STATE, hash_row.view(1, 2)).view(1, *self.config.mamba_state_shape)

    @staticmethod
    def _view(cache, comp: str) -> torch.Tensor:
        buf = cache.device_pools[cache.ci[comp]].buf
        return buf.view(buf.shape[0] * 2, buf.shape[2], -1)

    # ---- writes --------------------------------------------------------------------------
    def write_kv(self, cache, comp: str, idx: torch.Tensor, hashes: torch.Tensor) -> None:
        if idx.numel():
            view = self._view(cache, comp)
            view.index_copy_(1, self._on_device(idx), self.values(comp, hashes))

    def write_state(self, cache, slot: torch.Tensor, hash_row: torch.Tensor) -> None:
        cache.device_pools[cache.ci[STATE]].write(self._on_device(slot), self.state(hash_row))

    def write_states(self, cache, slots: torch.Tensor, hashes: torch.Tensor) -> None:
        """One state per slot: ``slots[i]`` gets the state after the prefix ``hashes[i]``."""
        states = self.values(STATE, hashes).view(-1, *self.config.mamba_state_shape)
        cache.device_pools[cache.ci[STATE]].write(self._on_device(slots), states)

    # ---- verification ----------------------------------------------------------------------
    def verify_kv(self, cache, comp: str, idx: torch.Tensor, hashes: torch.Tensor,
                  first_pos: int, req_id: str) -> None:
        """Raise ``ContentMismatch`` unless device slots ``idx`` hold ``comp``'s KV for the
        positions ``first_pos ..`` whose prefix hashes are ``hashes``."""
        if idx.numel() == 0:
            return
        view = self._view(cache, comp)
        got = view.index_select(1, self._on_device(idx))
        want = self.values(comp, hashes)
        if torch.equal(got, want):
            return
        bad = (got != want).any(dim=2).any(dim=0).cpu()
        k = int(bad.nonzero()[0])
        raise ContentMismatch(req_id, comp, first_pos + k, int(idx[k]), "KV")

    def verify_state(self, cache, slot: torch.Tensor, hash_row: torch.Tensor, position: int,
                     req_id: str) -> None:
        """Raise ``ContentMismatch`` unless MAMBA ``slot`` holds the state after ``position``."""
        got = cache.device_pools[cache.ci[STATE]].read(self._on_device(slot))
        if not torch.equal(got, self.state(hash_row)):
            raise ContentMismatch(req_id, STATE, position, int(slot[0]), "state")


__all__ = ["StandInModel", "ContentMismatch", "prefix_hashes", "namespace_salt"]
