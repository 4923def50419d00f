"""Storage keys: chained page hashes plus a fingerprint of what the bytes mean.

A page's hash is ``sha256(prior || page_tokens)``: ``prior`` is the previous page's 32-byte
digest, or for the first page the namespace seed of ``extra_key`` (nothing when ``extra_key``
is None). Tokens are packed as little-endian uint32 (SGLang's packing); a page holding a token
outside ``[0, 2**32)`` is hashed as a ``0xff`` tag byte then little-endian int64 words, so it
can never collide with a uint32 page. The packing is one tensor conversion per call, never a
per-token Python loop.

A storage key is ``"{page_hash_hex}.{fingerprint_hex}"``: the same tokens stored by another
model, dtype, shape, page size, component or layout land under another key, so a shared store
can never serve wrong KV. ``block_hash64`` (low 64 bits of the page hash) is the KV-event block
hash.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

HASH_BYTES = 32
_NS_TAG = b"radixscope-cache-namespace-v1"
_FP_TAG = b"radixscope-kv-fingerprint-v1"
_WIDE_TAG = b"\xff"
_U32_MAX = (1 << 32) - 1


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + struct.pack("<Q", len(raw)) + raw


def namespace_seed(extra_key: str | None) -> bytes | None:
    """The prior of a chain's first page: None without a namespace, else a 32-byte digest."""
    if extra_key is None:
        return None
    if not isinstance(extra_key, str):
        raise TypeError(f"extra_key must be a str or None, got {type(extra_key).__name__}")
    return hashlib.sha256(_NS_TAG + _field(extra_key)).digest()


def _token_tensor(tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be a 1-D integer tensor, got {tokens.dtype} "
                            f"of shape {tuple(tokens.shape)}")
        return tokens.detach().to("cpu", torch.int64).contiguous()
    try:
        return torch.as_tensor(tokens, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"tokens must be a sequence of ints: {exc}") from None


def _le(t: torch.Tensor) -> bytes:
    raw = t.numpy().tobytes()
    if sys.byteorder == "little":
        return raw
    from array import array  # big-endian hosts only: swap to the little-endian wire order
    a = array("I" if t.element_size() == 4 else "q")
    a.frombytes(raw)
    a.byteswap()
    return a.tobytes()


def page_hashes(tokens: Sequence[int] | torch.Tensor, page_size: int, *,
                prior: bytes | None = None, extra_key: str | None = None) -> tuple[bytes, ...]:
    """Chained 32-byte hashes of every whole page of ``tokens`` (a trailing partial page is not
    hashed).

    Args:
        tokens: token ids (list or 1-D integer tensor).
        page_size: tokens per page, >= 1.
        prior: hash of the page before ``tokens[0]`` (continue a chain, e.g. from the deepest
            host node); when given, ``extra_key`` is not used (the prior already carries it).
        extra_key: namespace seeding the first page of a chain (LoRA id, cache salt).

    Returns:
        One digest per whole page, in order.
    """
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if prior is not None and (not isinstance(prior, bytes) or len(prior) != HASH_BYTES):
        raise ValueError(f"prior must be {HASH_BYTES} bytes, got {prior!r}")
    t = _token_tensor(tokens)
    n_pages = t.numel() // page_size
    if n_pages == 0:
        return ()
    t = t[: n_pages * page_size]
    wide = bool(((t < 0) | (t > _U32_MAX)).any())
    if not wide:
        raw, width = _le(t.to(torch.int32)), 4          # int64 -> int32 keeps the low 32 bits
    else:
        raw, width = _le(t), 8
    step = page_size * width
    last = prior if prior is not None else namespace_seed(extra_key)
    if wide:  # only pages holding a wide token get the tagged int64 packing
        page_wide = ((t < 0) | (t > _U32_MAX)).view(n_pages, page_size).any(dim=1).tolist()
        narrow = _le(t.to(torch.int32))
    view = memoryview(raw)
    out = []
    sha = hashlib.sha256
    for i in range(n_pages):
        h = sha() if last is None else sha(last)
        if not wide:
            h.update(view[i * step:(i + 1) * step])
        elif page_wide[i]:
            h.update(_WIDE_TAG)
            h.update(view[i * step:(i + 1) * step])
        else:
            h.update(narrow[i * page_size * 4:(i + 1) * page_size * 4])
        last = h.digest()
        out.append(last)
    return tuple(out)


def block_hash64(page_hash: bytes) -> int:
    """The KV-event block hash: the low 64 bits of the page hash (its last 8 bytes, big-endian),
    an unsigned int in ``[0, 2**64)``."""
    if len(page_hash) != HASH_BYTES:
        raise ValueError(f"page hash must be {HASH_BYTES} bytes, got {len(page_hash)}")
    return int.from_bytes(page_hash[-8:], "big")


@dataclass(frozen=True)
class Fingerprint:
    """What a stored page's bytes mean. Any difference gives different keys.

    Attributes:
        model_id: model name and revision (weights that wrote the KV).
        dtype: element dtype name (``torch.bfloat16`` -> ``"bfloat16"``).
        layers / heads / head_dim: KV shape of one slot (heads on this rank).
        page_size: slots per stored page.
        component: ``full``, ``swa``, ``mamba``...
        layout: the serialized page layout (see ``pages.HostPages.layout``), plus anything
            else that changes bytes (tensor-parallel rank and size, state shape).
    """

    model_id: str
    dtype: str
    layers: int
    heads: int
    head_dim: int
    page_size: int
    component: str
    layout: str

    def __post_init__(self) -> None:
        for name in ("model_id", "dtype", "component", "layout"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"Fingerprint.{name}={v!r}: must be a non-empty str")
        for name in ("layers", "heads", "head_dim", "page_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Fingerprint.{name}={v!r}: must be an int >= 1")

    @property
    def digest(self) -> bytes:
        """16 bytes identifying every field."""
        h = hashlib.blake2b(_FP_TAG, digest_size=16)
        for name in ("model_id", "dtype", "component", "layout"):
            h.update(_field(getattr(self, name)))
        h.update(struct.pack("<4Q", self.layers, self.heads, self.head_dim, self.page_size))
        return h.digest()

    def keys(self, hashes: Sequence[bytes]) -> list[str]:
        """Storage keys of ``hashes`` under this fingerprint."""
        fp = self.digest.hex()
        return [f"{h.hex()}.{fp}" for h in hashes]
