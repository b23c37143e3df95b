"""The models the suites take a kernel's problems from give every registered kernel one: the
GPU tests over every kernel or op (fast path, bench, artifact cache) find their problems here."""

from __future__ import annotations

import pytest

import cutetune.ops  # noqa: F401  (registers every op, and with it every kernel)
from cutetune.kernels.names import KERNEL_NAMES
from cutetune.kernels.registry import get_kernel
from testkit.model_problems import (
    first_model_problems,
    model_problems,
    preset_problems,
    problems_by_model,
)


# The package's kernels: a test kernel another test registers in this worker has no model.
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_every_kernel_has_a_model_problem(name):
    kernel = get_kernel(name)
    every = model_problems(kernel)
    assert every and all(isinstance(p, kernel.problem_type) for p in every)
    assert len({p.static_key() for p in every}) == len(every)
    first = first_model_problems(kernel)
    assert first and {p.static_key() for p in first} <= {p.static_key() for p in every}
    assert {p.static_key() for p in preset_problems(kernel)} <= {p.static_key() for p in every}


def test_kernels_no_preset_uses_take_the_committed_configs_problems():
    mxfp8 = get_kernel("mxfp8_quant")
    assert [(p.hidden, p.scale_layout) for p in first_model_problems(mxfp8)] == [
        (4096, "swizzled"), (12288, "swizzled")]  # tests/data/hf_configs/Qwen3-8B-MXFP8.json
    assert preset_problems(mxfp8) == model_problems(mxfp8)
    gelu = get_kernel("gelu_and_mul")
    assert {p.approximate for p in model_problems(gelu)} == {"tanh"}  # the Gemma configs


def test_presets_come_first_and_keep_their_problems():
    rmsnorm = get_kernel("rmsnorm")
    presets = preset_problems(rmsnorm)
    every = model_problems(rmsnorm)
    assert every[:len(presets)] == presets and len(every) > len(presets)
    assert first_model_problems(rmsnorm) == problems_by_model(rmsnorm)[0]
