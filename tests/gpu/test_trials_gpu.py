"""The GPU trial runner's finalist re-measurement: the finalists side by side, in order."""

from __future__ import annotations

import pytest
import torch

from cutetune.device.measure import INTERLEAVED_ROUNDS, REPEATS
from cutetune.device.specs import device_spec_for
from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model
from cutetune.tuner.finals import FINAL_DRAWS
from cutetune.tuner.trials import GpuTrialRunner

# Compares times it measures: the GPU to itself (tests/gpu/conftest.py).
pytestmark = [pytest.mark.gpu, pytest.mark.timing]


def test_remeasure_gives_each_finalist_its_own_time_in_order():
    spec = device_spec_for(torch.cuda.get_device_name())
    problem = qk.problems_for_model(load_model("qwen3-0.6b"), "bfloat16")[0].with_tokens(4096)
    default = qk.default_config(problem, spec)
    other = next(c for c in qk.SPACE.valid_points(problem, spec) if c != default)
    runner = GpuTrialRunner(qk.KERNEL, problem, spec)
    alone = [runner.measure(c).median_us for c in (default, other)]
    first, second, again = runner.remeasure([default, other, default])
    repeats = FINAL_DRAWS * INTERLEAVED_ROUNDS * (REPEATS // INTERLEAVED_ROUNDS)
    assert first.repeats == second.repeats == again.repeats == repeats
    assert abs(first.median_us - again.median_us) < 0.1 * alone[0]
    for measured, own in zip((first, second), alone, strict=True):
        assert abs(measured.median_us - own) < 0.15 * own + 0.3


def test_remeasure_pools_as_many_draws_as_asked():
    spec = device_spec_for(torch.cuda.get_device_name())
    problem = qk.problems_for_model(load_model("qwen3-0.6b"), "bfloat16")[0].with_tokens(64)
    default = qk.default_config(problem, spec)
    (one_draw,) = GpuTrialRunner(qk.KERNEL, problem, spec).remeasure([default], draws=1)
    assert one_draw.repeats == INTERLEAVED_ROUNDS * (REPEATS // INTERLEAVED_ROUNDS)
