"""All cache configuration in one validated dataclass, plus realistic CPU-sized presets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

COMPONENT_ORDER = ("full", "swa", "mamba")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
_VALID_COMBOS = (("full",), ("full", "swa"), ("full", "mamba"), ("full", "swa", "mamba"))


def _need(cond: bool, name: str, value: object, why: str) -> None:
    if not cond:
        raise ValueError(f"CacheConfig.{name}={value!r}: {why}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_field(name: str, v: object, lo: int, none_ok: bool = False) -> None:
    """An int (never a bool) >= ``lo``: TypeError for the wrong type, ValueError below ``lo``."""
    if v is None and none_ok:
        return
    if not _is_int(v):
        want = "an int" + (" or None" if none_ok else "")
        raise TypeError(f"CacheConfig.{name}={v!r}: must be {want}, not {type(v).__name__}")
    _need(v >= lo, name, v, f"must be >= {lo}")


def _device(v: object) -> str:
    """``device`` as a canonical string: 'cpu', 'cuda' or 'cuda:N' (a str or torch.device)."""
    if v is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(v, (str, torch.device)):
        raise TypeError(f"CacheConfig.device={v!r}: must be 'cpu', 'cuda' or 'cuda:N' (a str or "
                        f"torch.device), not {type(v).__name__}")
    try:
        d = torch.device(v)
    except (RuntimeError, ValueError):
        raise ValueError(f"CacheConfig.device={v!r}: must be 'cpu' or 'cuda[:N]'") from None
    _need(d.type in ("cpu", "cuda"), "device", v, "must be 'cpu' or 'cuda[:N]' (pools need real "
          "memory; 'meta' and other devices hold none)" if d.type == "meta"
          else "must be 'cpu' or 'cuda[:N]'")
    if d.type == "cpu":
        _need(d.index in (None, 0), "device", v, "must be 'cpu' or 'cuda[:N]'")
        return "cpu"
    _need(torch.cuda.is_available(), "device", v, "CUDA is not available on this machine")
    n = torch.cuda.device_count()
    _need(d.index is None or d.index < n, "device", v, f"this machine has {n} CUDA device(s)")
    return "cuda" if d.index is None else f"cuda:{d.index}"


@dataclass(frozen=True)
class CacheConfig:
    """Everything the cache needs, validated at construction (bad values raise ValueError naming them).

    Sizes are in tokens (slots) for KV pools and in states for MAMBA pools. Pool sizes must be
    whole pages. ``device`` is a str or ``torch.device`` ('cpu', 'cuda', 'cuda:N'), stored as a
    str; ``None`` picks ``cuda`` when available, else ``cpu``. Whether the pools fit in memory
    is checked by ``cache.memory.check_fits`` when a cache is built, not here.
    """

    page_size: int = 1
    device_tokens: int = 1024
    host_tokens: int = 4096
    write_policy: str = "write_through"
    write_through_threshold: int = 2
    components: tuple[str, ...] = ("full",)
    layers: int = 2
    heads: int = 2
    head_dim: int = 8
    dtype: torch.dtype = torch.float32
    device: str | None = None
    # SWA
    sliding_window: int = 0
    swa_layers: int | None = None
    swa_device_tokens: int | None = None
    swa_host_tokens: int | None = None
    # MAMBA
    mamba_slots: int = 0
    mamba_host_slots: int = 0
    mamba_state_shape: tuple[int, ...] = (4, 8)
    mamba_max_states_per_path: int | None = None
    # load-back below this many FULL tokens (with no auxiliary data to load) is skipped
    load_back_threshold: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        """Validate every field (types first, then ranges and cross-field rules); raises
        TypeError / ValueError naming the field and the bad value. Allocates nothing."""
        for name in ("page_size", "layers", "heads", "head_dim", "write_through_threshold"):
            _int_field(name, getattr(self, name), 1)
        p = self.page_size
        for name in ("device_tokens", "host_tokens"):
            v = getattr(self, name)
            _int_field(name, v, 0)
            _need(v % p == 0, name, v, f"must be a multiple of page_size={p}")
        _need(self.device_tokens >= p, "device_tokens", self.device_tokens,
              f"must hold at least one page ({p} tokens)")
        _need(isinstance(self.write_policy, str) and self.write_policy in WRITE_POLICIES,
              "write_policy", self.write_policy, f"must be one of {WRITE_POLICIES}")
        object.__setattr__(self, "components", self._check_components(self.components))
        comps = self.components
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"CacheConfig.dtype={self.dtype!r}: must be a torch.dtype (e.g. "
                            f"torch.float16), not {type(self.dtype).__name__}")
        _need(self.dtype.is_floating_point, "dtype", self.dtype,
              "must be a floating-point dtype (KV and recurrent state are floats)")
        object.__setattr__(self, "device", _device(self.device))
        _int_field("load_back_threshold", self.load_back_threshold, 0)
        _int_field("sliding_window", self.sliding_window, 0)
        for name in ("swa_layers", "swa_device_tokens", "swa_host_tokens"):
            _int_field(name, getattr(self, name), 0, none_ok=True)
        for name in ("mamba_slots", "mamba_host_slots"):
            _int_field(name, getattr(self, name), 0)
        _int_field("mamba_max_states_per_path", self.mamba_max_states_per_path, 1, none_ok=True)
        shape = self.mamba_state_shape
        if not isinstance(shape, (tuple, list)) or not all(_is_int(d) for d in shape):
            raise TypeError(f"CacheConfig.mamba_state_shape={shape!r}: must be a tuple of ints")
        _need(len(shape) >= 1 and all(d >= 1 for d in shape), "mamba_state_shape", shape,
              "must be a non-empty tuple of ints >= 1")
        object.__setattr__(self, "mamba_state_shape", tuple(shape))
        if not isinstance(self.extra, dict):
            raise TypeError(f"CacheConfig.extra={self.extra!r}: must be a dict, not "
                            f"{type(self.extra).__name__}")
        if "swa" in comps:
            _need(self.sliding_window >= 1, "sliding_window", self.sliding_window,
                  "must be an int >= 1 when 'swa' is used")
            for name, default in (("swa_device_tokens", self.device_tokens),
                                  ("swa_host_tokens", self.host_tokens),
                                  ("swa_layers", self.layers)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
            for name in ("swa_device_tokens", "swa_host_tokens"):
                v = getattr(self, name)
                _need(v % p == 0, name, v, f"must be an int >= 0 and a multiple of page_size={p}")
            _need(self.swa_device_tokens >= p, "swa_device_tokens", self.swa_device_tokens,
                  "must hold at least one page")
            _need(self.swa_layers >= 1, "swa_layers", self.swa_layers, "must be an int >= 1")
        else:
            _need(self.sliding_window == 0, "sliding_window", self.sliding_window,
                  "is only meaningful with the 'swa' component")
        if "mamba" in comps:
            _need(self.mamba_slots >= 1, "mamba_slots", self.mamba_slots,
                  "must be an int >= 1 when 'mamba' is used")

    @staticmethod
    def _check_components(v: object) -> tuple[str, ...]:
        if not isinstance(v, (tuple, list)) or not all(isinstance(c, str) for c in v):
            raise TypeError(f"CacheConfig.components={v!r}: must be a tuple of component names "
                            f"from {COMPONENT_ORDER}, e.g. ('full', 'swa')")
        unknown = [c for c in v if c not in COMPONENT_ORDER]
        _need(not unknown, "components", v, f"unknown component(s) {unknown}; known: "
              f"{COMPONENT_ORDER}")
        comps = tuple(v)
        _need(comps in _VALID_COMBOS, "components", v, f"must be one of {_VALID_COMBOS}")
        return comps

    def bytes_needed(self) -> dict[str, int]:
        """Bytes each pool's buffer takes, by pool name (``full/device``, ``swa/host``...), for
        the components in use. Pure arithmetic: nothing is allocated."""
        item = torch.empty((), dtype=self.dtype).element_size()
        out: dict[str, int] = {}
        kv = 2 * self.heads * self.head_dim * item
        if "full" in self.components:
            out["full/device"] = self.layers * self.device_tokens * kv
            out["full/host"] = self.layers * self.host_tokens * kv
        if "swa" in self.components:
            out["swa/device"] = self.swa_layers * self.swa_device_tokens * kv
            out["swa/host"] = self.swa_layers * self.swa_host_tokens * kv
        if "mamba" in self.components:
            state = math.prod(self.mamba_state_shape) * item
            out["mamba/device"] = self.mamba_slots * state
            out["mamba/host"] = self.mamba_host_slots * state
        return out

    def pool_device(self, pool: str) -> str:
        """Where ``pool`` (a key of ``bytes_needed``) lives: host pools always on ``cpu``."""
        return "cpu" if pool.endswith("/host") else str(self.device)

    # ---- derived -------------------------------------------------------------------------
    @property
    def has_host(self) -> bool:
        return self.host_tokens > 0

    @property
    def full_layers(self) -> int:
        return self.layers

    def summary(self) -> dict:
        """Plain-data view (for snapshots, stores and bundles)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            out[f.name] = str(v) if isinstance(v, torch.dtype) else (list(v) if isinstance(v, tuple) else v)
        return out

    @classmethod
    def from_summary(cls, data: dict) -> CacheConfig:
        kw = dict(data)
        if "dtype" in kw and isinstance(kw["dtype"], str):
            kw["dtype"] = getattr(torch, kw["dtype"].replace("torch.", ""))
        for k in ("components", "mamba_state_shape"):
            if k in kw and kw[k] is not None:
                kw[k] = tuple(kw[k])
        kw["device"] = "cpu"
        return cls(**kw)

    @classmethod
    def preset(cls, name: str, **overrides) -> CacheConfig:
        """Realistic model shapes at CPU-friendly sizes.

        ``full``: dense attention; ``swa``: window 64 with interleaved full/SWA layers (1:3);
        ``mamba``: a MAMBA + attention hybrid; ``hybrid``: all three components.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        kw = dict(PRESETS[name])
        kw.update(overrides)
        return cls(**kw)


_BASE = dict(page_size=1, device_tokens=4096, host_tokens=16384, layers=2, heads=2, head_dim=16,
             dtype=torch.float32, device="cpu")
PRESETS: dict[str, dict] = {
    "full": dict(_BASE, components=("full",)),
    "swa": dict(_BASE, components=("full", "swa"), layers=1, swa_layers=3, sliding_window=64,
                swa_device_tokens=2048, swa_host_tokens=8192),
    "mamba": dict(_BASE, components=("full", "mamba"), layers=1, mamba_slots=64,
                  mamba_host_slots=256, mamba_state_shape=(4, 16), mamba_max_states_per_path=8),
    "hybrid": dict(_BASE, components=("full", "swa", "mamba"), layers=1, swa_layers=2,
                   sliding_window=64, swa_device_tokens=2048, swa_host_tokens=8192,
                   mamba_slots=64, mamba_host_slots=256, mamba_state_shape=(4, 16),
                   mamba_max_states_per_path=8),
}
# the preset a components list (as the CLI's --components names it) stands for
PRESET_OF_COMPONENTS: dict[tuple[str, ...], str] = {p["components"]: name
                                                   for name, p in PRESETS.items()}
