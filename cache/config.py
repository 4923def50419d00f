"""All cache configuration in one validated dataclass, plus realistic CPU-sized presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

COMPONENT_ORDER = ("full", "swa", "mamba")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
_VALID_COMBOS = (("full",), ("full", "swa"), ("full", "mamba"), ("full", "swa", "mamba"))


def _need(cond: bool, name: str, value: object, why: str) -> None:
    if not cond:
        raise ValueError(f"CacheConfig.{name}={value!r}: {why}")


@dataclass(frozen=True)
class CacheConfig:
    """Everything the cache needs, validated at construction (bad values raise ValueError naming them).

    Sizes are in tokens (slots) for KV pools and in states for MAMBA pools. Pool sizes must be
    whole pages. ``device=None`` picks ``cuda`` when available, else ``cpu``.
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
        for name in ("page_size", "layers", "heads", "head_dim", "write_through_threshold"):
            v = getattr(self, name)
            _need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v,
                  "must be an int >= 1")
        p = self.page_size
        for name in ("device_tokens", "host_tokens"):
            v = getattr(self, name)
            _need(isinstance(v, int) and not isinstance(v, bool) and v >= 0, name, v,
                  "must be an int >= 0")
            _need(v % p == 0, name, v, f"must be a multiple of page_size={p}")
        _need(self.device_tokens >= p, "device_tokens", self.device_tokens,
              f"must hold at least one page ({p} tokens)")
        _need(self.write_policy in WRITE_POLICIES, "write_policy", self.write_policy,
              f"must be one of {WRITE_POLICIES}")
        comps = tuple(self.components)
        _need(comps in _VALID_COMBOS, "components", self.components,
              f"must be one of {_VALID_COMBOS}")
        object.__setattr__(self, "components", comps)
        _need(isinstance(self.dtype, torch.dtype), "dtype", self.dtype, "must be a torch.dtype")
        dev = self.device
        if dev is None:
            dev = "cuda" if torch.cuda.is_available() else "cpu"
            object.__setattr__(self, "device", dev)
        _need(dev == "cpu" or dev.startswith("cuda"), "device", dev, "must be 'cpu' or 'cuda[:N]'")
        if dev.startswith("cuda"):
            _need(torch.cuda.is_available(), "device", dev, "CUDA is not available on this machine")
        _need(self.load_back_threshold >= 0, "load_back_threshold", self.load_back_threshold,
              "must be >= 0")
        if "swa" in comps:
            _need(isinstance(self.sliding_window, int) and self.sliding_window >= 1,
                  "sliding_window", self.sliding_window, "must be an int >= 1 when 'swa' is used")
            for name, default in (("swa_device_tokens", self.device_tokens),
                                  ("swa_host_tokens", self.host_tokens),
                                  ("swa_layers", self.layers)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
            for name in ("swa_device_tokens", "swa_host_tokens"):
                v = getattr(self, name)
                _need(isinstance(v, int) and v >= 0 and v % p == 0, name, v,
                      f"must be an int >= 0 and a multiple of page_size={p}")
            _need(self.swa_device_tokens >= p, "swa_device_tokens", self.swa_device_tokens,
                  "must hold at least one page")
            _need(isinstance(self.swa_layers, int) and self.swa_layers >= 1, "swa_layers",
                  self.swa_layers, "must be an int >= 1")
        else:
            _need(self.sliding_window == 0, "sliding_window", self.sliding_window,
                  "is only meaningful with the 'swa' component")
        if "mamba" in comps:
            _need(isinstance(self.mamba_slots, int) and self.mamba_slots >= 1, "mamba_slots",
                  self.mamba_slots, "must be an int >= 1 when 'mamba' is used")
            _need(isinstance(self.mamba_host_slots, int) and self.mamba_host_slots >= 0,
                  "mamba_host_slots", self.mamba_host_slots, "must be an int >= 0")
            shape = tuple(self.mamba_state_shape)
            _need(len(shape) >= 1 and all(isinstance(d, int) and d >= 1 for d in shape),
                  "mamba_state_shape", self.mamba_state_shape, "must be a tuple of ints >= 1")
            object.__setattr__(self, "mamba_state_shape", shape)
            cap = self.mamba_max_states_per_path
            _need(cap is None or (isinstance(cap, int) and cap >= 1), "mamba_max_states_per_path",
                  cap, "must be None or an int >= 1")

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
