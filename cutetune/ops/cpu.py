"""The ops' CPU path. Where the tensors are on the CPU, an op computes with its kernel's fp32
torch reference (the function every tuned kernel is verified against) and writes the result as
the kernel does: the same output dtype, the same in-place updates. It lets a model patched with
cutetune's ops run, and be tested, on a machine without a GPU; it is correct, not fast."""

from __future__ import annotations

import torch

from cutetune.kernels.registry import KernelDef


def reference_outputs(kernel: KernelDef, static: tuple, num_tokens: int,
                      tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The kernel's reference outputs (fp32) for the call the op was about to look up."""
    problem = kernel.problem_type.from_static_tuple(static, num_tokens)
    return kernel.reference(tensors, problem)
