"""Chained page hashes and fingerprints: the definition, pinned by recomputation."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest
import torch

from radixscope.cache.storage import Fingerprint, block_hash64, namespace_seed, page_hashes


def reference(tokens: list[int], page: int, prior: bytes | None) -> list[bytes]:
    out = []
    for i in range(len(tokens) // page):
        h = hashlib.sha256(prior or b"")
        h.update(b"".join(struct.pack("<I", t) for t in tokens[i * page:(i + 1) * page]))
        prior = h.digest()
        out.append(prior)
    return out


def test_chain_is_sha256_of_prior_and_uint32_tokens() -> None:
    toks = [5, 70000, 2**32 - 1, 0, 9, 9, 9]
    assert list(page_hashes(toks, 2)) == reference(toks, 2, None)  # trailing page dropped
    seed = namespace_seed("lora-7")
    assert list(page_hashes(toks, 3, extra_key="lora-7")) == reference(toks, 3, seed)
    assert page_hashes(torch.tensor(toks), 2) == page_hashes(toks, 2)


def test_chain_properties() -> None:
    toks = list(range(1000, 1064))
    full = page_hashes(toks, 8)
    assert len(full) == 8 and len(set(full)) == 8
    assert page_hashes(toks[:24], 8) == full[:3]                      # a prefix keeps its keys
    assert page_hashes(toks[24:], 8, prior=full[2]) == full[3:]        # chains continue
    assert page_hashes(toks, 8, extra_key="a") != page_hashes(toks, 8, extra_key="b")
    assert page_hashes(toks, 8, extra_key="a")[0] != full[0]
    other = toks[:8] + [7] + toks[9:]
    assert page_hashes(other, 8)[0] == full[0] and page_hashes(other, 8)[1] != full[1]


def test_wide_tokens_are_tagged_never_colliding() -> None:
    wide = page_hashes([2**32 + 5, 1], 2)[0]
    assert wide == hashlib.sha256(b"\xff" + struct.pack("<2q", 2**32 + 5, 1)).digest()
    assert wide != page_hashes([5, 1], 2)[0]
    mixed = page_hashes([1, 2, 2**40, 3], 2)
    assert mixed[0] == page_hashes([1, 2], 2)[0]                      # narrow pages unchanged


def test_block_hash64_is_the_low_64_bits() -> None:
    h = page_hashes([1, 2, 3, 4], 4)[0]
    assert block_hash64(h) == int.from_bytes(h, "big") & (2**64 - 1)
    assert 0 <= block_hash64(h) < 2**64


def test_every_fingerprint_field_changes_the_key() -> None:
    fp = Fingerprint("llama-3-8b@abc", "bfloat16", 32, 8, 128, 16, "full", "page-major:[...]")
    h = page_hashes(list(range(16)), 16)
    base = fp.keys(h)[0]
    assert base.startswith(h[0].hex() + ".")
    changes = {"model_id": "llama-3-8b@abd", "dtype": "float16", "layers": 31, "heads": 4,
               "head_dim": 64, "page_size": 32, "component": "swa", "layout": "other"}
    keys = {fp.keys(h)[0] for fp in (dataclasses.replace(fp, **{k: v})
                                    for k, v in changes.items())}
    assert len(keys) == len(changes) and base not in keys


@pytest.mark.parametrize("bad", [{"page_size": 0}, {"model_id": ""}, {"heads": True}])
def test_bad_fingerprint_raises(bad: dict) -> None:
    args = dict(model_id="m", dtype="float32", layers=1, heads=1, head_dim=1, page_size=1,
                component="full", layout="x") | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        Fingerprint(**args)


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="page_size"):
        page_hashes([1], 0)
    with pytest.raises(TypeError):
        page_hashes(torch.tensor([1.0]), 1)
    with pytest.raises(ValueError, match="prior"):
        page_hashes([1], 1, prior=b"short")
