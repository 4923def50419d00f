"""The stand-in model's uploads: pinned and queued under CUDA (``engine/uploads.py``; the CUDA
side runs in tests/cache/test_gpu_staged.py), untouched on the CPU."""

from __future__ import annotations

import pytest
import torch

from radixscope.engine.model import StandInModel, prefix_hashes
from radixscope.engine.uploads import PinnedUploads
from tests.kits.cachekit import make_config


def test_pinned_uploads_are_for_a_cuda_device_only():
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        PinnedUploads(torch.device("cpu"))


def test_on_the_cpu_the_model_pins_nothing_and_hands_tensors_through():
    model = StandInModel(make_config(("full",)))
    h = prefix_hashes(torch.arange(5))
    assert model._uploads is None
    assert model._on_device(h) is h
    assert model.values("full", h).shape == (2 * 2, 5, 4)
