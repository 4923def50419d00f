"""Shared pytest setup: ``gpu`` tests run only where CUDA is present; the long fuzz profile
(``RADIXSCOPE_FUZZ=long``) runs without the per-test timeout (pyproject's ``timeout``)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.kits.storagekit import mooncake_cluster, redis_server  # noqa: F401 -- shared fixtures


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RADIXSCOPE_FUZZ") == "long":  # as long as RADIXSCOPE_FUZZ_OPS asks
        for item in items:
            item.add_marker(pytest.mark.timeout(0))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
