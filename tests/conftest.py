"""Shared test setup: the `gpu` marker skips unless an NVIDIA GPU and driver are usable."""

from __future__ import annotations

import functools
import os

import pytest


@functools.lru_cache(maxsize=1)
def _gpu_available() -> bool:
    if os.environ.get("LUCEBOX_FORCE_NO_GPU") == "1":
        return False
    try:
        from lucebox_cli.engines import _lib
    except ImportError:
        return False
    try:
        return _lib.gpu_count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no usable NVIDIA GPU (gpu tests run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
