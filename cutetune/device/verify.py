"""Check one compiled point against the kernel's fp32 reference on fresh random data."""

from __future__ import annotations

import torch

from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.kernels.registry import KernelDef, Tensors, VerificationError, compare
from cutetune.spaces.problem import Problem


def check_outputs(kernel: KernelDef, problem: Problem, outputs: Tensors,
                  expected: dict[str, torch.Tensor], label: str = "", roundings: int = 1) -> None:
    """Judge a run's outputs: the kernel's own check where it declares one, else every integer
    output (a flag, an index) exactly and every float one within the tolerance of its dtype,
    times `roundings`: the times the values were rounded to that dtype on their way (the
    kernel's one store; an unfused chain stores once a step, and the next step reads the
    rounded values)."""
    if kernel.check is not None:
        if roundings != 1:
            raise ValueError(f"{kernel.name} judges its outputs with its own check, which "
                             "takes no count of roundings")
        try:
            kernel.check(outputs, expected, problem)
        except VerificationError as err:
            raise VerificationError(f"{label}{err}") from None
        return
    for name in kernel.outputs:
        if not outputs[name].is_floating_point():
            # A flag or an index: exactly the reference's.
            compare(f"{label}{name}", outputs[name], expected[name], 0.0, 0.0)
            continue
        # By the output's own dtype: a kernel may write a narrower or wider type than it reads.
        rtol, atol = kernel.tolerance[DTYPE_NAMES[outputs[name].dtype]]
        compare(f"{label}{name}", outputs[name], expected[name], roundings * rtol,
                roundings * atol)


def poison(t: torch.Tensor) -> None:
    """Fill an output so that an element the kernel fails to write cannot pass: NaN for floats,
    the most negative value for integers; all bits set for the one-byte floats (torch fills
    float4_e2m1fn_x2 with no value), which is NaN in e4m3 and E8M0 and (-6, -6) in e2m1 pairs."""
    if t.is_floating_point() and t.element_size() == 1:
        t.view(torch.uint8).fill_(0xFF)
        return
    t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).min)


def verify(kernel: KernelDef, problem: Problem, compiled, device: torch.device,
           seed: int) -> None:
    """Run `compiled` once on fresh random inputs and compare every output with the reference.

    Outputs not written in place are poisoned first, so an unwritten element fails; outputs
    written in place start as random inputs, which a missed element leaves unchanged and so
    far from the normalised reference."""
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = kernel.make_inputs(problem, device, generator)
    expected = kernel.reference(tensors, problem)
    for name in kernel.outputs:
        if name not in kernel.written_in_place:
            poison(tensors[name])
    kernel.launch(compiled, tensors)
    torch.cuda.synchronize(device)
    check_outputs(kernel, problem, tensors, expected)
