"""Bad input to ``CacheConfig`` (issue 12, item 10): every field is validated at construction,
before anything is allocated, with a TypeError (wrong type) or ValueError (bad value) whose
message names the field and the bad value. And pools that cannot fit in memory are refused
with the number before any buffer exists (item 9)."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache.config import PRESETS, CacheConfig
from radixscope.cache.hiradix import HiRadixCache
from radixscope.cache.memory import NotEnoughMemory, check_fits, needed_by_device

SWA = dict(components=("full", "swa"), sliding_window=4)
MAMBA = dict(components=("full", "mamba"), mamba_slots=4)
T, V = TypeError, ValueError

CASES = [  # (id, overrides, exception, text the message must hold)
    ("page_size bool", dict(page_size=True), T, "page_size=True"),
    ("page_size zero", dict(page_size=0), V, "page_size=0"),
    ("page_size negative", dict(page_size=-4), V, "page_size=-4"),
    ("page_size float", dict(page_size=2.0), T, "page_size=2.0"),
    ("page_size str", dict(page_size="4"), T, "page_size='4'"),
    ("layers bool", dict(layers=True), T, "layers=True"),
    ("layers zero", dict(layers=0), V, "layers=0"),
    ("heads negative", dict(heads=-1), V, "heads=-1"),
    ("head_dim None", dict(head_dim=None), T, "head_dim=None"),
    ("device_tokens bool", dict(device_tokens=True), T, "device_tokens=True"),
    ("device_tokens negative", dict(device_tokens=-8), V, "device_tokens=-8"),
    ("device_tokens zero", dict(device_tokens=0), V, "device_tokens=0"),
    ("device_tokens not whole pages", dict(page_size=4, device_tokens=30), V,
     "multiple of page_size=4"),
    ("host_tokens float", dict(host_tokens=1.5), T, "host_tokens=1.5"),
    ("host_tokens negative", dict(host_tokens=-1), V, "host_tokens=-1"),
    ("write_policy unknown", dict(write_policy="write_around"), V, "write_around"),
    ("write_policy None", dict(write_policy=None), V, "write_policy=None"),
    ("write_policy list", dict(write_policy=["write_back"]), V, "['write_back']"),
    ("write_through_threshold bool", dict(write_through_threshold=False), T,
     "write_through_threshold=False"),
    ("write_through_threshold zero", dict(write_through_threshold=0), V,
     "write_through_threshold=0"),
    ("components a string", dict(components="full"), T, "components='full'"),
    ("components unknown name", dict(components=("full", "attn")), V, "['attn']"),
    ("components without full", dict(components=("swa",)), V, "('swa',)"),
    ("components out of order", dict(components=("mamba", "full")), V, "('mamba', 'full')"),
    ("components repeated", dict(components=("full", "full")), V, "('full', 'full')"),
    ("components of ints", dict(components=(1, 2)), T, "(1, 2)"),
    ("dtype a string", dict(dtype="float16"), T, "dtype='float16'"),
    ("dtype an int type", dict(dtype=torch.int64), V, "dtype=torch.int64"),
    ("dtype bool", dict(dtype=torch.bool), V, "dtype=torch.bool"),
    ("dtype python float", dict(dtype=float), T, "dtype=<class 'float'>"),
    ("device an int", dict(device=5), T, "device=5"),
    ("device meta string", dict(device="meta"), V, "device='meta'"),
    ("device meta torch.device", dict(device=torch.device("meta")), V, "type='meta'"),
    ("device tpu", dict(device="tpu"), V, "device='tpu'"),
    ("device empty", dict(device=""), V, "device=''"),
    ("device garbage", dict(device="cuda:x"), V, "device='cuda:x'"),
    ("device cpu:3", dict(device="cpu:3"), V, "device='cpu:3'"),
    ("device a list", dict(device=["cpu"]), T, "device=['cpu']"),
    ("load_back_threshold negative", dict(load_back_threshold=-1), V, "load_back_threshold=-1"),
    ("load_back_threshold bool", dict(load_back_threshold=True), T, "load_back_threshold=True"),
    ("load_back_threshold str", dict(load_back_threshold="8"), T, "load_back_threshold='8'"),
    ("load_back_threshold float", dict(load_back_threshold=0.5), T, "load_back_threshold=0.5"),
    ("sliding_window without swa", dict(sliding_window=8), V, "sliding_window=8"),
    ("sliding_window zero with swa", dict(SWA, sliding_window=0), V, "sliding_window=0"),
    ("sliding_window bool", dict(SWA, sliding_window=True), T, "sliding_window=True"),
    ("sliding_window negative", dict(SWA, sliding_window=-2), V, "sliding_window=-2"),
    ("swa_layers bool", dict(SWA, swa_layers=True), T, "swa_layers=True"),
    ("swa_layers zero", dict(SWA, swa_layers=0), V, "swa_layers=0"),
    ("swa_device_tokens zero", dict(SWA, swa_device_tokens=0), V, "swa_device_tokens=0"),
    ("swa_device_tokens not whole pages", dict(SWA, page_size=4, device_tokens=32,
                                               host_tokens=64, swa_device_tokens=6), V,
     "swa_device_tokens=6"),
    ("swa_host_tokens str", dict(SWA, swa_host_tokens="64"), T, "swa_host_tokens='64'"),
    ("swa_host_tokens negative", dict(SWA, swa_host_tokens=-64), V, "swa_host_tokens=-64"),
    ("mamba_slots zero with mamba", dict(MAMBA, mamba_slots=0), V, "mamba_slots=0"),
    ("mamba_slots bool", dict(MAMBA, mamba_slots=True), T, "mamba_slots=True"),
    ("mamba_host_slots negative", dict(MAMBA, mamba_host_slots=-1), V, "mamba_host_slots=-1"),
    ("mamba_state_shape an int", dict(MAMBA, mamba_state_shape=8), T, "mamba_state_shape=8"),
    ("mamba_state_shape empty", dict(MAMBA, mamba_state_shape=()), V, "mamba_state_shape=()"),
    ("mamba_state_shape zero dim", dict(MAMBA, mamba_state_shape=(4, 0)), V, "(4, 0)"),
    ("mamba_state_shape bool dim", dict(MAMBA, mamba_state_shape=(True, 3)), T, "(True, 3)"),
    ("mamba_max_states_per_path zero", dict(MAMBA, mamba_max_states_per_path=0), V,
     "mamba_max_states_per_path=0"),
    ("mamba_max_states_per_path bool", dict(MAMBA, mamba_max_states_per_path=True), T,
     "mamba_max_states_per_path=True"),
    ("extra not a dict", dict(extra=[1]), T, "extra=[1]"),
]


@pytest.mark.parametrize("overrides,exc,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_config_rejects_bad_field(overrides, exc, needle):
    kw = dict(page_size=1, device_tokens=32, host_tokens=64, device="cpu")
    kw.update(overrides)
    with pytest.raises(exc) as info:
        CacheConfig(**kw)
    msg = str(info.value)
    assert needle in msg, msg
    assert msg.startswith("CacheConfig."), msg  # names the field


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("field,value,exc", [
    ("device_tokens", True, T), ("layers", 0, V), ("device", 5, T), ("load_back_threshold", -1, V),
])
def test_every_preset_validates_its_overrides(preset, field, value, exc):
    with pytest.raises(exc, match=f"CacheConfig.{field}="):
        CacheConfig.preset(preset, **{field: value})


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="'huge'"):
        CacheConfig.preset("huge")


# ---- regression tests, one per defect of issue 12 item 10 ----------------------------------
def test_device_int_raised_attribute_error():
    with pytest.raises(TypeError, match=r"CacheConfig.device=5: must be 'cpu', 'cuda' or"):
        CacheConfig(device=5)


def test_load_back_threshold_was_never_validated():
    with pytest.raises(TypeError, match=r"CacheConfig.load_back_threshold='x'"):
        CacheConfig(load_back_threshold="x")


@pytest.mark.parametrize("field,extra", [("load_back_threshold", {}), ("sliding_window", SWA),
                                         ("mamba_max_states_per_path", MAMBA),
                                         ("swa_layers", SWA)])
def test_true_was_accepted_where_an_int_is_meant(field, extra):
    with pytest.raises(TypeError, match=f"CacheConfig.{field}=True: must be an int"):
        CacheConfig(device="cpu", **{**extra, field: True})


@pytest.mark.parametrize("device", [torch.device("meta"), "meta"])
def test_meta_device_raised_not_implemented(device):
    with pytest.raises(ValueError, match="'meta' and other devices hold none"):
        CacheConfig(device=device)


def test_a_torch_device_is_accepted_and_normalized():
    assert CacheConfig(device=torch.device("cpu")).device == "cpu"
    assert CacheConfig(device="cpu:0").device == "cpu"


# ---- sizes against memory (item 9, at the cache's depth) -----------------------------------
def test_bytes_needed_per_pool():
    c = CacheConfig.preset("hybrid")  # layers 1, swa_layers 2, heads 2, head_dim 16, float32
    kv = 2 * 2 * 16 * 4
    assert c.bytes_needed() == {
        "full/device": 1 * 4096 * kv, "full/host": 1 * 16384 * kv,
        "swa/device": 2 * 2048 * kv, "swa/host": 2 * 8192 * kv,
        "mamba/device": 64 * 4 * 16 * 4, "mamba/host": 256 * 4 * 16 * 4}
    by_dev = needed_by_device(c)
    assert set(by_dev) == {"cpu"} and by_dev["cpu"]["full/device"] == 4096 * kv


def test_check_fits_names_the_numbers():
    c = CacheConfig(device_tokens=1024, host_tokens=0, device="cpu")  # 1024 * 256 B
    need = 1024 * 256 + 1024 * 40
    check_fits(c, available=lambda d: need)  # exactly enough
    with pytest.raises(NotEnoughMemory) as info:
        check_fits(c, available=lambda d: need - 1)
    assert f"need {need:,} bytes" in str(info.value)
    assert f"only {need - 1:,} bytes" in str(info.value) and "of cpu memory" in str(info.value)


def test_huge_device_tokens_raised_memory_error_inside_the_pools():
    """``HiRadixCache`` refuses before allocating (was a bare MemoryError from the pools)."""
    c = CacheConfig(device_tokens=10**13, host_tokens=0, device="cpu")
    with pytest.raises(NotEnoughMemory, match=r"need [\d,]+ bytes .* of cpu memory"):
        HiRadixCache(c)
    assert isinstance(NotEnoughMemory("x"), ValueError)
