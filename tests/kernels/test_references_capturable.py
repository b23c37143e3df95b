"""Every kernel's torch reference is one a CUDA graph can capture: `cutetune bench` times torch
eager (the reference) inside a capture, which cannot copy host memory to the device nor read a
device value back. Run on meta tensors under testkit.capturable's checks."""

from __future__ import annotations

import pytest
import torch

import cutetune.ops  # noqa: F401  (registers every op, and with it every kernel)
from cutetune.kernels.names import KERNEL_NAMES
from cutetune.kernels.registry import get_kernel
from testkit.capturable import run_on_meta
from testkit.model_problems import first_model_problems

TOKENS = 3


# The package's kernels: a test kernel another test registers in this worker has no model.
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_the_reference_copies_nothing_between_host_and_device(name):
    kernel = get_kernel(name)
    problem = first_model_problems(kernel)[0].with_tokens(TOKENS)
    tensors = kernel.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = run_on_meta(lambda on_meta: kernel.reference(on_meta, problem), tensors)
    assert {t.device.type for t in expected.values()} == {"meta"}
