"""The unfused chains `cutetune bench` times beside the fused FP8 kernels (KernelDef.unfused):
silu_and_mul, or rmsnorm in the fused problem's form, then fp8_group_quant of the row the first
step writes. Run on the CPU with each step standing in as its kernel's reference, the chain must
give the fused kernel's reference, judged by the fused kernel's own check, in the layout its
outputs have (the column-major scales padded)."""

import dataclasses

import pytest
import torch

from cutetune import bench
from cutetune.bench import UNFUSED_NAME, candidates
from cutetune.build.compiled import CompiledPoints
from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs
from cutetune.kernels.activation import GeluAndMulProblem, SiluAndMulProblem
from cutetune.kernels.fp8_group_quant import (
    SILU_QUANT_KERNEL,
    FP8GroupQuantProblem,
    SiluAndMulFP8QuantProblem,
)
from cutetune.kernels.registry import VerificationError
from cutetune.kernels.rmsnorm_fp8_quant import KERNEL as NORM_KERNEL
from cutetune.kernels.rmsnorm_fp8_quant import RMSNormFP8QuantProblem
from cutetune.serving.plan import ServingPlan
from testkit.reference_runner import reference_runner

H200 = DEVICE_SPECS["H200"]


def _silu(tokens=5, intermediate=256, group=128, column_major=True, ue8m0=False):
    return SiluAndMulFP8QuantProblem(num_tokens=tokens, dtype="bfloat16",
                                     intermediate=intermediate, group_size=group,
                                     column_major_scales=column_major, ue8m0=ue8m0)


def _norm(tokens=5, hidden=512, fused_add=True, group=128, column_major=True, ue8m0=False,
          dtype="bfloat16"):
    return RMSNormFP8QuantProblem(num_tokens=tokens, dtype=dtype, hidden=hidden, eps=1e-6,
                                  weight_bias=0.0, fused_add=fused_add, group_size=group,
                                  column_major_scales=column_major, ue8m0=ue8m0)


def _quant_of(problem, width):
    return FP8GroupQuantProblem(num_tokens=problem.num_tokens, dtype=problem.dtype, hidden=width,
                                group_size=problem.group_size,
                                column_major_scales=problem.column_major_scales,
                                ue8m0=problem.ue8m0)


def test_the_silu_chain_is_silu_and_mul_then_fp8_group_quant_of_its_activation():
    p = _silu(group=64, column_major=False, ue8m0=True)
    assert [(step.kernel, step.problem(p), dict(step.names), step.rounds)
            for step in SILU_QUANT_KERNEL.unfused] == [
        ("silu_and_mul", SiluAndMulProblem(num_tokens=5, dtype="bfloat16", intermediate=256),
         {"out": "activation"}, False),
        ("fp8_group_quant", _quant_of(p, 256), {"x": "activation"}, False)]
    assert SILU_QUANT_KERNEL.peers == ()


@pytest.mark.parametrize("fused_add", [True, False])
def test_the_norm_chain_is_rmsnorm_in_its_form_then_fp8_group_quant_of_the_row(fused_add):
    p = _norm(fused_add=fused_add, dtype="float16")
    assert [(step.kernel, step.problem(p), dict(step.names), step.rounds)
            for step in NORM_KERNEL.unfused] == [
        ("rmsnorm", p.norm_problem(fused_add=fused_add), {"out": "normed"}, False),
        ("fp8_group_quant", _quant_of(p, 512), {"x": "normed"}, False)]
    assert p.norm_problem(fused_add).out_dtype == "float16"
    assert NORM_KERNEL.peers == ()


@pytest.mark.parametrize("kernel, problem", [
    (SILU_QUANT_KERNEL, _silu()),
    (SILU_QUANT_KERNEL, _silu(tokens=3, group=64, column_major=False, ue8m0=True)),
    (NORM_KERNEL, _norm()),
    (NORM_KERNEL, _norm(tokens=3, hidden=256, fused_add=False, group=64, ue8m0=True)),
    (NORM_KERNEL, _norm(tokens=4, hidden=256, fused_add=False, column_major=False)),
], ids=lambda v: getattr(v, "name", None) or v.describe())
def test_bench_runs_the_chain_into_the_fused_kernels_outputs(kernel, problem, monkeypatch):
    served = []
    monkeypatch.setattr(bench, "ours_runner", reference_runner(served))
    found = {c.name: c for c in candidates(kernel, problem, ServingPlan(H200), CompiledPoints())}
    steps = [step.kernel for step in kernel.unfused]
    chain = found[f"{UNFUSED_NAME}: {' + '.join(steps)}"]
    assert [name for name, _ in served[-2:]] == steps
    assert chain.roundings == 1  # the fused kernel's own check judges it
    inputs = kernel.bench_inputs(problem, "cpu", torch.Generator().manual_seed(4))
    expected = kernel.reference(inputs, problem)
    given = kernel.bench_inputs(problem, "cpu", torch.Generator().manual_seed(4))
    outputs = chain.run(given)
    assert set(outputs) == set(kernel.outputs)
    check_outputs(kernel, problem, outputs, expected, roundings=chain.roundings)
    # Fresh outputs keep the layout of the fused kernel's: the scales' transpose of
    # column-major scales padded to 4 tokens (or row-major ones), q's rows.
    assert outputs["scales"] is not given["scales"]
    assert outputs["scales"].stride() == given["scales"].stride()
    assert outputs["q"].stride() == given["q"].stride()
    if "residual" in kernel.outputs:
        assert outputs["residual"] is given["residual"]  # the fused add's sum, in place


def test_a_chain_of_another_activation_fails_the_fused_check(monkeypatch):
    """The check the chain is judged by can fail: gelu_and_mul in silu_and_mul's place."""
    monkeypatch.setattr(bench, "ours_runner", reference_runner([]))
    problem = _silu()
    first, quant = SILU_QUANT_KERNEL.unfused
    gelu = dataclasses.replace(first, kernel="gelu_and_mul", problem=lambda p: GeluAndMulProblem(
        num_tokens=p.num_tokens, dtype=p.dtype, intermediate=p.intermediate, approximate="none"))
    kernel = dataclasses.replace(SILU_QUANT_KERNEL, unfused=(gelu, quant))
    found = {c.name: c for c in candidates(kernel, problem, ServingPlan(H200), CompiledPoints())}
    chain = found[f"{UNFUSED_NAME}: gelu_and_mul + fp8_group_quant"]
    inputs = kernel.bench_inputs(problem, "cpu", torch.Generator().manual_seed(4))
    expected = kernel.reference(inputs, problem)
    with pytest.raises(VerificationError, match="q: "):
        check_outputs(kernel, problem, chain.run(inputs), expected)
