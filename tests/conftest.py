"""Shared test setup: compile for sm_90a on machines without a GPU, skip GPU tests there."""

import os

# CuTeDSL reads the target when it is first imported; set it before any test module imports
# cutlass, so every compile test runs on the CPU machine (an explicit setting still wins).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
    for item in gpu_items:
        item.add_marker(skip)
