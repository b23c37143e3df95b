"""The ops' CPU path. Where the tensors are on the CPU, an op computes with its kernel's fp32
torch reference (the function every tuned kernel is verified against) and writes the result as
the kernel does: the same output dtype, the same in-place updates. It lets a model patched with
cutetune's ops run, and be tested, on a machine without a GPU; it is correct, not fast."""

from __future__ import annotations

import torch

from cutetune.kernels.registry import KernelDef


def write_reference(kernel: KernelDef, static: tuple, num_tokens: int,
                    inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    """Write the kernel's reference results (fp32) for the call the op was about to look up
    into `outputs`, by output name, as the kernel writes them."""
    problem = kernel.problem_type.from_static_tuple(static, num_tokens)
    expected = kernel.reference(inputs, problem)
    for name, tensor in outputs.items():
        tensor.copy_(expected[name])
