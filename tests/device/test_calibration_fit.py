"""The calibrated cost model (issue 42 items 1 and 6): its prediction is the sum of its named
terms, and the fit recovers known constants from synthetic trials generated with them."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import pytest

from cutetune.device.calibrated import (
    FORM,
    CalibratedModel,
    datasheet_terms,
    features,
    read_stored,
)
from cutetune.device.calibration_fit import (
    IN_FLIGHT_GRID,
    MIN_TRIALS,
    Sample,
    TooFewTrials,
    TunedBucket,
    fit,
    nonnegative_least_squares,
    prune_factor,
)
from cutetune.device.funnel import make_plan
from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.cost import Cost
from cutetune.kernels.registry import get_kernel
from cutetune.spaces.models import load_model
from testkit.known_cost_model import KNOWN

H200 = DEVICE_SPECS["H200"]
TRUE = KNOWN


def synthetic_costs(count: int, seed: int = 0) -> list[Cost]:
    """Points of every shape the terms tell apart: one or two launches, with and without a
    grid barrier, grids from one block to many waves, decode-sized to prefill-sized bytes,
    few to many bytes in flight per thread."""
    rng = random.Random(seed)
    costs = []
    for _ in range(count):
        threads = rng.choice((32, 64, 128, 256, 512, 1024))
        costs.append(Cost(
            bytes_moved=int(10 ** rng.uniform(3, 9)), flops=0,
            blocks=rng.choice((1, 8, 64, 132, 264, 1000, 20000)),
            threads_per_block=threads, registers_per_thread=rng.choice((32, 64)),
            launches=rng.choice((1, 1, 2)), grid_barriers=rng.choice((0, 0, 1)),
            bytes_in_flight_per_thread=rng.choice((4, 8, 16, 32, 64))))
    return costs


def samples_from(model: CalibratedModel, costs: list[Cost], noise: float = 0.0,
                 seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    return [Sample(c, model.predict_us(c, H200) * (1 + rng.uniform(-noise, noise)),
                   TunedBucket("rmsnorm", "p", i % 7)) for i, c in enumerate(costs)]


def test_the_prediction_is_the_sum_of_its_named_terms():
    cost = synthetic_costs(1, seed=3)[0]
    terms = TRUE.terms(cost, H200)
    f = features(cost, H200, TRUE.in_flight_bytes)
    assert terms.launch_us == cost.launches * TRUE.launch_us
    assert terms.waves_us == f.waves * TRUE.wave_us
    assert terms.barrier_us == cost.grid_barriers * TRUE.barrier_us
    assert terms.memory_us == pytest.approx(cost.bytes_moved / 1e6 / f.efficiency * 0.22)
    assert TRUE.predict_us(cost, H200) == pytest.approx(
        terms.launch_us + terms.waves_us + terms.barrier_us + terms.memory_us)
    assert "launch" in terms.describe() and "barrier" in terms.describe()


def test_a_compute_bound_point_is_priced_as_the_bytes_the_datasheet_moves_meanwhile():
    cost = Cost(bytes_moved=1000, flops=67 * 10**9, blocks=132, threads_per_block=256,
                registers_per_thread=32)
    # 67 GFLOP at the 67 TFLOP/s fp32 peak is 1 ms: the datasheet's 4.8 TB/s moves 4.8 GB.
    assert features(cost, H200, 8192).effective_mb == pytest.approx(4800.0)


def test_datasheet_terms_add_up_to_the_roofline_prediction():
    ceilings = Ceilings.from_datasheet(H200)
    for cost in synthetic_costs(20):
        prediction = predict(cost, H200, ceilings)
        assert datasheet_terms(cost, prediction, ceilings).total_us == pytest.approx(
            prediction.predicted_us)


def test_the_fit_recovers_the_constants_that_generated_the_trials():
    model = fit(samples_from(TRUE, synthetic_costs(200)), H200, "NVIDIA H200")
    assert model.in_flight_bytes == TRUE.in_flight_bytes
    for name in ("launch_us", "wave_us", "barrier_us", "us_per_mb"):
        assert getattr(model, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert model.median_error == pytest.approx(0.0, abs=1e-9)
    assert model.trials == 200 and model.form == FORM


def test_the_fit_recovers_them_through_measurement_noise():
    model = fit(samples_from(TRUE, synthetic_costs(400), noise=0.03), H200, "NVIDIA H200")
    assert model.in_flight_bytes == TRUE.in_flight_bytes
    for name in ("launch_us", "wave_us", "barrier_us", "us_per_mb"):
        assert getattr(model, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    assert model.median_error < 0.03


def test_a_term_the_trials_never_exercise_fits_to_zero_not_below():
    no_barrier = dataclasses.replace(TRUE, barrier_us=0.0)
    costs = [dataclasses.replace(c, grid_barriers=0) for c in synthetic_costs(100)]
    model = fit(samples_from(no_barrier, costs), H200, "NVIDIA H200")
    assert model.barrier_us == 0.0
    assert model.launch_us == pytest.approx(TRUE.launch_us, rel=1e-6)


def test_too_few_trials_is_one_line_with_what_it_has_and_needs():
    with pytest.raises(TooFewTrials) as refused:
        fit(samples_from(TRUE, synthetic_costs(MIN_TRIALS - 1)), H200, "NVIDIA H200")
    assert str(refused.value) == (f"NVIDIA H200: {MIN_TRIALS - 1} verified trials stored, "
                                  f"calibration needs at least {MIN_TRIALS}; nothing stored")


def test_nonnegative_least_squares_clamps_what_plain_least_squares_drives_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # unconstrained: 4 - x, a negative slope
    x, residual = nonnegative_least_squares(a, b)
    assert x[1] == 0.0 and x[0] == pytest.approx(2.0)  # the mean, with the slope clamped
    assert residual == pytest.approx(2.0)


def test_prune_factor_keeps_each_buckets_near_best_point_in_the_quantile():
    # Bucket a: the fastest measured point is predicted 1.5x the best prediction; bucket b:
    # the best prediction is also the fastest; the 95% quantile of (1.5, 1.0) is 1.475.
    a, b = TunedBucket("rmsnorm", "p", 8), TunedBucket("rmsnorm", "p", 64)
    samples = [Sample(None, 10.0, a), Sample(None, 8.0, a),
               Sample(None, 5.0, b), Sample(None, 6.0, b)]
    assert prune_factor(samples, np.array([2.0, 3.0, 1.0, 2.0])) == pytest.approx(1.475)
    assert prune_factor(samples[:1], np.array([1.0])) == math.inf
    # Never within 10% of the best: measurement noise alone moves a point that much.
    assert prune_factor(samples[2:], np.array([1.0, 2.0])) == pytest.approx(1.1)
    # A point within 1% of the fastest, predicted best, needs no band beyond the floor.
    near = [Sample(None, 8.05, a), Sample(None, 8.0, a)]
    assert prune_factor(near, np.array([1.0, 3.0])) == pytest.approx(1.1)


def test_a_stored_calibration_reads_back_and_another_form_reads_as_none():
    assert CalibratedModel.from_json(TRUE.to_json()) == TRUE
    assert read_stored(TRUE.to_json()) == TRUE
    assert read_stored(None) is None
    assert read_stored(TRUE.to_json().replace(FORM, "older-form")) is None
    with pytest.raises(ValueError, match="fields"):
        CalibratedModel.from_json(json.dumps({"form": FORM, "launch_us": 1}))


def test_in_flight_grid_holds_the_true_value():
    assert TRUE.in_flight_bytes in IN_FLIGHT_GRID


def test_the_funnel_ranks_and_prunes_with_the_calibrated_model_and_says_so():
    kernel = get_kernel("rmsnorm")
    problem = kernel.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0].with_tokens(32768)
    ceilings = Ceilings.from_datasheet(H200)
    plan = make_plan(kernel, problem, H200, ceilings, TRUE)
    best = plan.kept[0].prediction.predicted_us
    for point in plan.kept + plan.pruned:
        assert point.prediction.predicted_us == pytest.approx(
            TRUE.predict_us(point.cost, H200))
        assert point.terms.total_us == pytest.approx(point.prediction.predicted_us)
    assert all(p.prediction.predicted_us <= best * TRUE.prune_factor for p in plan.kept)
    assert all(p.prediction.predicted_us > best * TRUE.prune_factor for p in plan.pruned)
    assert plan.pruned, "a 1.2x band prunes some of rmsnorm's points at 32768 tokens"
    assert (f"kept {len(plan.kept)} (pruned {len(plan.pruned)} by the calibrated model: "
            "predicted over 1.20x the best)") in plan.funnel()
