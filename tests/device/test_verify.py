"""Judging outputs on the CPU: tolerance by output dtype, a kernel's own check, poisoning."""

import dataclasses

import pytest
import torch

from cutetune.device.verify import check_outputs, poison
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.registry import VerificationError

PROBLEM = qk.QKNormProblem(num_tokens=2, dtype="bfloat16", head_dim=64, q_heads=2, kv_heads=1,
                           eps=1e-6, weight_bias=0.0)


def outputs_and_expected(q_error: float):
    expected = {"q": torch.ones(2, 2, 64), "k": torch.ones(2, 1, 64)}
    outputs = {"q": (expected["q"] + q_error).bfloat16(), "k": expected["k"].bfloat16()}
    return outputs, expected


def test_within_the_output_dtype_tolerance_passes_and_beyond_fails():
    check_outputs(qk.KERNEL, PROBLEM, *outputs_and_expected(0.01))
    with pytest.raises(VerificationError, match="run: q: 256 of 256 elements off"):
        check_outputs(qk.KERNEL, PROBLEM, *outputs_and_expected(0.5), label="run: ")


def test_each_rounding_on_the_way_widens_the_tolerance_by_one():
    rtol, atol = qk.KERNEL.tolerance["bfloat16"]
    off = 1.5 * (rtol + atol)  # beyond one rounding's tolerance at 1.0, within two
    with pytest.raises(VerificationError, match="q: 256 of 256 elements off"):
        check_outputs(qk.KERNEL, PROBLEM, *outputs_and_expected(off))
    check_outputs(qk.KERNEL, PROBLEM, *outputs_and_expected(off), roundings=2)


def test_a_kernel_check_replaces_the_tolerance_comparison():
    seen = []

    def check(outputs, expected, problem):
        seen.append(problem)
        raise VerificationError("rows out of order")

    kernel = dataclasses.replace(qk.KERNEL, check=check)
    with pytest.raises(VerificationError, match="^ours: rows out of order$"):
        check_outputs(kernel, PROBLEM, *outputs_and_expected(0.0), label="ours: ")
    assert seen == [PROBLEM]


def test_poison_makes_unwritten_elements_detectable():
    floats, ints = torch.zeros(3), torch.zeros(3, dtype=torch.int32)
    poison(floats)
    poison(ints)
    assert torch.isnan(floats).all()
    assert (ints == torch.iinfo(torch.int32).min).all()
