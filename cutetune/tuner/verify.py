"""Check one compiled point against the kernel's fp32 reference on fresh random data."""

from __future__ import annotations

import torch

from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.kernels.registry import KernelDef, Tensors
from cutetune.spaces.problem import Problem


class VerificationError(Exception):
    """The kernel's output does not match the reference; the message says where and by how much."""


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float,
            atol: float) -> None:
    if tuple(actual.shape) != tuple(expected.shape):
        raise VerificationError(f"{name}: shape {tuple(actual.shape)}, expected "
                                f"{tuple(expected.shape)}")
    actual = actual.float()
    error = (actual - expected).abs()
    bad = ~(error <= atol + rtol * expected.abs())  # NaN compares false, so it counts as bad
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise VerificationError(
            f"{name}: {count} of {actual.numel()} elements off (rtol {rtol:g}, atol {atol:g}); "
            f"first at {first}: got {actual[first].item():.6g}, "
            f"expected {expected[first].item():.6g}")


def check_outputs(kernel: KernelDef, tensors: Tensors,
                  expected: dict[str, torch.Tensor]) -> None:
    for name in kernel.outputs:
        # By the output's own dtype: a kernel may write a narrower or wider type than it reads.
        rtol, atol = kernel.tolerance[DTYPE_NAMES[tensors[name].dtype]]
        compare(name, tensors[name], expected[name], rtol, atol)


def verify(kernel: KernelDef, problem: Problem, compiled, device: torch.device,
           seed: int) -> None:
    """Run `compiled` once on fresh random inputs and compare every output with the reference.

    Outputs not written in place are poisoned with NaN first, so an unwritten element fails;
    outputs written in place start as random inputs, which a missed element leaves unchanged
    and so far from the normalised reference."""
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = kernel.make_inputs(problem, device, generator)
    expected = kernel.reference(tensors, problem)
    for name in kernel.outputs:
        if name not in kernel.written_in_place:
            tensors[name].fill_(float("nan"))
    kernel.launch(compiled, tensors)
    torch.cuda.synchronize(device)
    check_outputs(kernel, tensors, expected)
