"""The ops' CPU path. Where the tensors are on the CPU, an op computes with its kernel's fp32
torch reference (the function every tuned kernel is verified against) and writes the result as
the kernel does: the same output dtype, the same in-place updates. It lets a model patched with
cutetune's ops run, and be tested, on a machine without a GPU; it is correct, not fast."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem


def write_reference(kernel: KernelDef, problem: Problem, tensors: Mapping[str, torch.Tensor],
                    outputs: Iterable[str]) -> None:
    """Write the kernel's reference results (fp32) for `problem` into the `outputs` of its
    `tensors` (the kernel's arguments by name), in that order, as the kernel writes them."""
    expected = kernel.reference(tensors, problem)
    for name in outputs:
        tensors[name].copy_(expected[name])
