"""The knob factors of the calibrated model (issue 42 items 1 and 6): fitted to synthetic trials
whose knobs cost known factors, the fit recovers them, predicts a problem it never saw from the
others, and says how far to trust that; the model applies them where a point is named."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import make_plan
from cutetune.device.knob_effects import KnobEffects, knob_names
from cutetune.device.knob_fit import (
    NEAR_BEST,
    PRUNE_FACTOR_FLOOR,
    KnobSample,
    fit_knob_effects,
    needed_band,
    needed_factor,
)
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.registry import get_kernel
from cutetune.spaces.models import load_model
from testkit.known_cost_model import KNOWN

H200 = DEVICE_SPECS["H200"]
# At 8 tokens a wide vector costs and more warps save; at 4096 the other way round.
TRUE = {8: {"vec=4": 0.0, "vec=8": 0.15, "warps=1": 0.0, "warps=4": -0.1},
        4096: {"vec=4": 0.0, "vec=8": -0.2, "warps=1": 0.0, "warps=4": 0.05}}


def synthetic(problems: tuple[str, ...], kernel: str = "k", seed: int = 0) -> list[KnobSample]:
    """Every (vec, warps) point of each problem at both buckets; the terms' prediction a
    random time, the measurement that times the true knob factors and a level of its own per
    problem (which the fit must ignore: only the ranking within a bucket is fitted)."""
    rng = random.Random(seed)
    samples = []
    for level, problem in enumerate(problems, 1):
        for bucket, (vec, warps) in itertools.product(TRUE, itertools.product((4, 8), (1, 4))):
            knobs = (f"vec={vec}", f"warps={warps}")
            predicted = rng.uniform(2.0, 3.0)
            measured = predicted * level * math.exp(sum(TRUE[bucket][k] for k in knobs))
            samples.append(KnobSample(kernel, problem, bucket, knobs, predicted, measured))
    return samples


def test_the_fit_recovers_how_each_knob_value_ranks_against_the_others():
    effects = fit_knob_effects(synthetic(tuple(f"p{i}" for i in range(12))))
    for bucket, truth in TRUE.items():
        fitted = effects.log_factors["k"][bucket]
        # The fit is centred: what it recovers is each value against the other of its knob,
        # shrunk a little by the ridge.
        assert fitted["vec=8"] - fitted["vec=4"] == pytest.approx(
            truth["vec=8"] - truth["vec=4"], rel=0.1)
        assert fitted["warps=4"] - fitted["warps=1"] == pytest.approx(
            truth["warps=4"] - truth["warps=1"], rel=0.1)


def test_a_problem_predicted_from_the_others_keeps_its_fastest_point_at_the_floor():
    effects = fit_knob_effects(synthetic(("p1", "p2", "p3")))
    # The factors transfer exactly, so the fastest point is the best corrected prediction
    # wherever a problem is left out: the prune factor is the floor.
    assert effects.prune_factors == {"k": PRUNE_FACTOR_FLOOR}


def test_a_kernel_tuned_for_one_problem_keeps_no_factors():
    samples = synthetic(("p1", "p2")) + synthetic(("only",), kernel="alone")
    effects = fit_knob_effects(samples)
    assert set(effects.log_factors) == set(effects.prune_factors) == {"k"}
    assert effects.factor("alone", 8, None) == 1.0


def test_needed_factor_is_a_near_best_points_corrected_prediction_over_the_best():
    samples = [KnobSample("k", "p", 8, ("vec=4",), 1.0, 5.0),
               KnobSample("k", "p", 8, ("vec=8",), 2.0, 4.0)]
    assert needed_factor(samples, {}) == pytest.approx(2.0)
    # A factor of 0.5 for vec=8 makes the fastest point also the best prediction.
    assert needed_factor(samples, {"vec=8": math.log(0.5)}) == pytest.approx(1.0)
    # A point within NEAR_BEST of the fastest is as good a find: the band keeps the first of
    # them it reaches.
    near = [KnobSample("k", "p", 8, ("vec=4",), 1.0, 4.0 * (1 + NEAR_BEST)),
            KnobSample("k", "p", 8, ("vec=8",), 2.0, 4.0)]
    assert needed_factor(near, {}) == pytest.approx(1.0)
    assert needed_band([(4.0 * (1 + 2 * NEAR_BEST), 1.0), (4.0, 2.0)]) == pytest.approx(2.0)


def test_the_model_multiplies_its_terms_by_the_factor_of_a_named_point():
    kernel = get_kernel("rmsnorm")
    problem = kernel.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0].with_tokens(8)
    config = kernel.default_config(problem, H200)
    knobs = knob_names(config)
    effects = KnobEffects({"rmsnorm": {8: {knobs[0]: math.log(0.8)}}}, {"rmsnorm": 1.3})
    model = dataclasses.replace(KNOWN, knobs=effects)
    cost = kernel.cost(problem, config, H200)
    terms = model.terms(cost, H200, ("rmsnorm", 8, config))
    assert terms.knob_factor == pytest.approx(0.8)
    assert terms.total_us == pytest.approx(0.8 * KNOWN.predict_us(cost, H200))
    assert "x0.80 for its knobs" in terms.describe()
    # Another bucket, another kernel or no point named: the terms alone.
    for point in (("rmsnorm", 64, config), ("qk_norm", 8, config), None):
        assert model.predict_us(cost, H200, point) == KNOWN.predict_us(cost, H200)
    assert model.prune_factor_of("rmsnorm") == 1.3
    assert model.prune_factor_of("qk_norm") == KNOWN.prune_factor
    assert CalibratedModel.from_json(model.to_json()) == model


def test_the_funnel_ranks_by_the_factors_and_prunes_by_the_kernels_own_band():
    kernel = get_kernel("rmsnorm")
    problem = kernel.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0].with_tokens(8)
    ceilings = Ceilings.from_datasheet(H200)
    plain = make_plan(kernel, problem, H200, ceilings, KNOWN)
    # The point the terms rank last is made 100x faster by its knobs: it now ranks first.
    last = plain.pruned[-1].config if plain.pruned else plain.kept[-1].config
    factors = {name: 0.0 for point in plain.kept + plain.pruned
               for name in knob_names(point.config)}
    model = dataclasses.replace(KNOWN, knobs=KnobEffects(
        {"rmsnorm": {8: factors}}, {"rmsnorm": 1.05}))
    # Every knob value but the last point's is slowed 100x in turn: only it keeps factor 1.
    for name in factors:
        factors[name] = 0.0 if name in knob_names(last) else math.log(100.0)
    plan = make_plan(kernel, problem, H200, ceilings, model)
    assert plan.kept[0].config == last
    assert "predicted over 1.05x the best" in plan.funnel()
    assert all(p.prediction.predicted_us <= 1.05 * plan.kept[0].prediction.predicted_us
               for p in plan.kept)
