"""Shared pytest setup: ``gpu`` tests run only where CUDA is present."""

from __future__ import annotations

import pytest
import torch

from tests.kits.storagekit import mooncake_cluster, redis_server  # noqa: F401 -- shared fixtures


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
