"""benchmarks/winner_repick.py: recorded runs' finals picked again at other band floors by the
tuner's rule (synthetic run rows of a real problem: test inputs, not measurements)."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import winner_repick
from benchmarks.winner_repro import problem_label
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from cutetune.tuner import finals
from cutetune.tuner.tune import plan_bucket

SPEC = DEVICE_SPECS["H200"]
STATIC = qk.KERNEL.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]


def two_points():
    """The bucket's plan and two of its kept points that are not the default."""
    plan = plan_bucket(qk.KERNEL, STATIC, 1, SPEC, Ceilings.from_datasheet(SPEC))
    return plan, [p for p in plan.plan.kept if p.config != plan.default][:2]


def rows(run: int, times: dict) -> list[dict]:
    """A run's finalists of qwen3-8b's qk_norm at one token, with these medians."""
    return [{"model": "qwen3-8b", "run": run, "kernel": "qk_norm",
             "problem": problem_label(STATIC.static_key()), "bucket": 1, "kind": "finalist",
             "config": config_to_json(p.config), "median_us": us, "iqr_us": 0.001}
            for p, us in times.items()]


def test_a_wider_floor_ties_what_a_narrower_one_split():
    plan, (first, second) = two_points()
    # The order prefers the lower predicted time.
    preferred, other = sorted((first, second), key=lambda p: finals.preference(
        p.config, plan.default, p.prediction.predicted_us))

    # Run 1 reads the preferred point 2.5% slower than the other; run 2 reads it fastest.
    runs = pd.DataFrame(rows(1, {preferred: 1.025, other: 1.0})
                        + rows(2, {preferred: 1.0, other: 1.01})
                        + [{**rows(1, {preferred: 1.0})[0], "problem": "hidden=1"}])
    results, left_out = winner_repick.repick(runs, SPEC, [0.02, 0.03])
    assert left_out == 1  # the bucket whose problem no kernel of the model describes
    narrow, wide = results
    assert (narrow.buckets, narrow.same_winner, wide.same_winner) == (1, 0, 1)
    assert (narrow.unshared, wide.unshared) == (0, 0)  # both runs re-measured both points
    assert narrow.price_max_pct == pytest.approx(0.0)
    assert wide.price_median_pct == pytest.approx(1.25)
    assert wide.price_max_pct == pytest.approx(2.5)


def test_runs_that_name_a_point_another_did_not_re_measure_are_counted_apart():
    _, (first, second) = two_points()
    # Each run re-measured only its own point: no floor makes them agree.
    runs = pd.DataFrame(rows(1, {first: 1.0}) + rows(2, {second: 1.0}))
    (result,), _ = winner_repick.repick(runs, SPEC, [0.5])
    assert (result.same_winner, result.unshared) == (0, 1)
