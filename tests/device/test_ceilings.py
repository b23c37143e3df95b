"""The ceilings step's grid-barrier probe (issue 42 item 1): its kernel compiles for every
barrier count on the CPU, and the cost of one barrier is the slope of time over barriers."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import pytest

from cutetune.device.ceilings import BARRIER_ROUNDS, _barriers, _compile, slope_and_intercept


@pytest.mark.parametrize("rounds", BARRIER_ROUNDS)
def test_the_barrier_probe_compiles_for_each_barrier_count(rounds):
    fake = cute.runtime.make_fake_compact_tensor(cutlass.Int32, (64,), assumed_align=4)
    assert _compile(_barriers, fake, constants=(rounds, 132, 128)) is not None


def test_slope_and_intercept_of_a_line_and_of_noise_about_it():
    assert slope_and_intercept([0, 1, 2, 4], [3.0, 4.0, 5.0, 7.0]) == pytest.approx((1.0, 3.0))
    slope, intercept = slope_and_intercept([0, 1, 2, 4], [3.1, 3.9, 5.0, 7.0])
    assert slope == pytest.approx(0.98857, abs=1e-4)
    assert intercept == pytest.approx(3.02, abs=1e-4)


def test_the_run_measures_again_where_any_ceiling_is_missing():
    from dataclasses import fields

    from cutetune.device.specs import Ceilings
    from cutetune.tuner.model_run import MEASURED_CEILINGS

    assert MEASURED_CEILINGS == {f.name for f in fields(Ceilings)} - {"measured"}
