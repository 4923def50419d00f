"""Token-id keys: validation, page truncation and prefix comparison (no tree, no memory).

Keys are ``array('Q')``: 8 bytes a token in one buffer (a tuple of Python ints costs 8 bytes
of pointer plus a 32-byte int object a token, and one more object for the collector to track),
and slices of two arrays compare with one C loop over the buffers, several times faster than
tuples of ints."""

from __future__ import annotations

from array import array

import numpy as np
import torch

_NAMESPACE_TYPES = (str, int, type(None))


KEY_TYPECODE = "Q"  # unsigned 64-bit token ids


def empty_key() -> array:
    return array(KEY_TYPECODE)


class TokenKey:
    """A validated token sequence (``tokens``: an ``array('Q')``; treat it as immutable). Build one per request and pass it to
    ``match_prefix`` and ``insert``: validation (O(n)) then happens once, not per call."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: object) -> None:
        self.tokens = _validate(tokens, "key")

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, item):
        if isinstance(item, slice):
            out = TokenKey.__new__(TokenKey)
            out.tokens = self.tokens[item]
            return out
        return self.tokens[item]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenKey) and other.tokens == self.tokens

    def __hash__(self) -> int:
        return hash(self.tokens.tobytes())

    def __repr__(self) -> str:
        head = ", ".join(map(str, self.tokens[:8]))
        return f"TokenKey([{head}{', ...' if len(self.tokens) > 8 else ''}] len={len(self)})"


def normalize_key(key: object, page_size: int, name: str = "key") -> array:
    """Validate ``key`` (a ``TokenKey``, a list / tuple of ints >= 0, or a 1-D integer tensor,
    numpy array or ``array``) and truncate it to whole pages. Raises TypeError/ValueError
    naming the bad value; never mutates anything."""
    toks = key.tokens if type(key) is TokenKey else _validate(key, name)
    n = len(toks) - len(toks) % page_size
    return toks if n == len(toks) else toks[:n]


def _validate(key: object, name: str) -> array:
    """Lists and tuples go through ``array('Q', key)`` (one C pass over the Python ints);
    integer tensors, numpy arrays and arrays of another integer typecode go through
    numpy (one cast of the buffer), not item by item: a 2,000-token tensor costs ~6 us instead
    of ~40 (``bench/bench_keys.py``). Masked arrays are refused (their masked ids would be
    read as the fill value)."""
    if type(key) is array and key.typecode == KEY_TYPECODE:
        return array(KEY_TYPECODE, key)  # a copy: the caller may go on changing theirs
    if isinstance(key, torch.Tensor):
        if key.dim() != 1:
            raise ValueError(f"{name} tensor must be 1-D, got shape {tuple(key.shape)}")
        if key.dtype.is_floating_point or key.dtype.is_complex or key.dtype == torch.bool:
            raise TypeError(f"{name} tensor must have an integer dtype, got {key.dtype}")
        try:
            ints = key.detach().cpu().numpy()
        except TypeError:  # a dtype this torch cannot hand to numpy (unsigned, on old builds)
            key = key.tolist()
        else:
            return _from_ints(ints, name)
    elif isinstance(key, np.ndarray):
        if isinstance(key, np.ma.MaskedArray):
            raise TypeError(f"{name} must not be a masked array (masked token ids have no "
                            f"value), got one of shape {key.shape} with "
                            f"{int(np.ma.count_masked(key))} masked")
        if key.ndim != 1:
            raise ValueError(f"{name} array must be 1-D, got shape {key.shape}")
        if key.dtype.kind not in "iu":
            raise TypeError(f"{name} array must have an integer dtype, got {key.dtype}")
        return _from_ints(key, name)
    elif isinstance(key, array):
        if key.typecode in _INT_TYPECODES:
            return _from_ints(np.frombuffer(key, dtype=key.typecode), name)
    elif not isinstance(key, (list, tuple)):
        raise TypeError(f"{name} must be a list/tuple of ints or a 1-D integer tensor / numpy "
                        f"array / array, got {type(key).__name__}")
    try:
        return array(KEY_TYPECODE, key)  # one C pass: every element an int, none negative
    except (TypeError, OverflowError):
        _raise_bad_token(tuple(key), name)
        raise


_INT_TYPECODES = frozenset("bBhHiIlLqQ")
_MIN = np.minimum.reduce  # the ufunc itself: ``ndarray.min`` adds a Python-level wrapper


def _from_ints(a: np.ndarray, name: str) -> array:
    """A 1-D integer buffer as a key: negatives refused (naming the first), one cast."""
    if a.dtype.kind == "i" and a.size and _MIN(a) < 0:
        i = int(np.argmax(a < 0))
        raise ValueError(f"{name} holds a negative token id {int(a[i])} at position {i}")
    out = array(KEY_TYPECODE)
    out.frombytes(a.astype(np.uint64, copy=False).tobytes())
    return out


def _raise_bad_token(toks: tuple, name: str) -> None:
    for i, t in enumerate(toks):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{name} must hold ints, found {t!r} ({type(t).__name__}) at "
                            f"position {i}")
        if t < 0:
            raise ValueError(f"{name} holds a negative token id {t} at position {i}")
        if t >= 1 << 64:
            raise ValueError(f"{name} holds a token id outside uint64: {t} at position {i}")
    raise AssertionError("unreachable: array('Q') rejected a valid key")


def check_namespace(extra_key: object) -> object:
    if not isinstance(extra_key, _NAMESPACE_TYPES) or isinstance(extra_key, bool):
        raise TypeError(f"extra_key must be None, a str or an int, got {extra_key!r}")
    return extra_key


def child_key(tokens: array, offset: int, page_size: int) -> object:
    """The key a child is filed under in its parent: its first page (an int when page_size 1,
    else a tuple of ints)."""
    if page_size == 1:
        return tokens[offset]
    return tuple(tokens[offset:offset + page_size])


def ceil_paged(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def key_len(key) -> int:
    """Length of a key before validation (TypeError for a non-sequence)."""
    if type(key) is TokenKey:
        return len(key.tokens)
    try:
        return len(key)
    except TypeError:
        raise TypeError(f"key must be a list/tuple of ints or a 1-D integer tensor / numpy "
                        f"array / array, got {type(key).__name__}") from None
