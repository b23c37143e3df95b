"""Naming the winner from the finalists: near-ties resolve to the same point whatever the noise,
a clear win still wins, the default wins its ties, and what is stored is each point's own time.

A fake runner gives each point a base time; the side-by-side re-measurement adds to each
finalist one of a set of noise offsets, and every assignment of the offsets is tried, as fresh
runs on one GPU would draw them."""

from __future__ import annotations

import itertools
import json

import optuna
import pytest

from cutetune.device.funnel import make_plan
from cutetune.device.measure import Measurement
from cutetune.kernels import qk_norm as qk
from cutetune.results_db import Database, trials_frame, winners
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from cutetune.tuner.finals import TIE_BAND_FLOOR, finalists, pick, preference, tie_band
from cutetune.tuner.study import FINALS_ATTR, TrialOutcome, run_study
from cutetune.tuner.tune import plan_bucket, tune_bucket
from testkit.fake_qk_runner import CEILINGS, FINGERPRINT, SPEC

STATIC = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
PROBLEM = STATIC.with_tokens(1)
PLAN = make_plan(qk.KERNEL, PROBLEM, SPEC, CEILINGS)
DEFAULT = qk.default_config(PROBLEM, SPEC)
PREDICTED = {p.config: p.prediction.predicted_us for p in PLAN.kept}


def order(config) -> tuple:
    """A config's place in the fixed order (the default first, then the predicted time, then
    canonical JSON)."""
    return preference(config, DEFAULT, PREDICTED[config])


# Four points other than the default, in the fixed order.
POINTS = sorted([p.config for p in PLAN.kept if p.config != DEFAULT][:4], key=order)
SLOW_US = 20.0  # every other point: far from the finals, each a little apart
RANK = {p.config: i for i, p in enumerate(PLAN.kept)}


class NoisyRunner:
    """Base times by point (SLOW_US for the others, each a little apart); the re-measurement
    adds `noise[config]` (us) to a finalist's base time."""

    def __init__(self, base: dict, noise: dict, iqr_us: float = 0.02):
        self.base, self.noise, self.iqr_us = base, noise, iqr_us
        self.remeasured: list[list] = []

    def time_of(self, config) -> float:
        return self.base.get(config, SLOW_US + 0.01 * RANK.get(config, 0))

    def measure(self, config):
        return Measurement(self.time_of(config), self.iqr_us, 25)

    def remeasure(self, configs):
        self.remeasured.append(list(configs))
        return [Measurement(self.time_of(c) + self.noise.get(c, 0.0), self.iqr_us, 25)
                for c in configs]


def noise_orders(points, offsets):
    """Every assignment of `offsets` to `points`."""
    return [dict(zip(points, order, strict=True)) for order in itertools.permutations(offsets)]


def winners_over(base: dict, points, offsets, **kwargs) -> set:
    return {run_study(qk.KERNEL, PLAN, DEFAULT, NoisyRunner(base, noise), budget=500,
                      study_name="t", **kwargs).winner.config
            for noise in noise_orders(points, offsets)}


def test_near_ties_name_the_same_winner_whatever_the_noise_order():
    # Three points 0.5% apart, the default far behind; the noise (up to 1%) reorders them.
    near = POINTS[:3]
    base = {near[0]: 10.05, near[1]: 10.0, near[2]: 10.1, DEFAULT: 15.0}
    named = winners_over(base, near, (0.0, 0.05, 0.1))
    assert named == {near[0]}  # the first of the tied in the fixed order, every time


def test_a_point_faster_by_more_than_the_band_wins_in_every_noise_order():
    # The last point in the fixed order is 5% faster than three tied points (the default one).
    fast = POINTS[3]
    base = {POINTS[0]: 10.5, POINTS[1]: 10.52, DEFAULT: 10.55, fast: 10.0}
    assert winners_over(base, [POINTS[0], POINTS[1], DEFAULT, fast],
                        (0.0, 0.02, 0.04, 0.06)) == {fast}


def test_the_default_wins_its_ties():
    # The default is 1% behind the fastest side by side: tied, and first in the fixed order.
    base = {POINTS[0]: 10.0, POINTS[1]: 10.3, DEFAULT: 10.1}
    assert winners_over(base, [POINTS[0]], (0.0,)) == {DEFAULT}
    # With no band beyond the re-measurement's own (tiny) spread, the fastest wins.
    assert winners_over(base, [POINTS[0]], (0.0,), tie_band=0.0) == {POINTS[0]}


def test_a_lent_point_wins_its_ties_before_the_default():
    # The lent point 1% behind the fastest and the default 2%: all tied, the lent one first.
    lent = POINTS[2]
    base = {POINTS[0]: 10.0, lent: 10.1, DEFAULT: 10.2}
    assert winners_over(base, [POINTS[0], lent], (0.0, 0.05), lent=[lent]) == {lent}
    # 6% behind, it ties with nothing: the default wins its tie as without it.
    base = {POINTS[0]: 10.0, lent: 10.6, DEFAULT: 10.2}
    assert winners_over(base, [POINTS[0]], (0.0,), lent=[lent]) == {DEFAULT}
    assert preference(lent, DEFAULT, PREDICTED[lent], {lent}) < preference(
        DEFAULT, DEFAULT, PREDICTED[DEFAULT], {lent})


def test_the_incumbent_wins_its_ties_before_the_lent_points_and_is_always_remeasured():
    incumbent, lent = POINTS[3], POINTS[2]
    # All within the band of the fastest side by side: the incumbent, last of them in the
    # order without it, is named in every noise order.
    base = {POINTS[0]: 10.0, lent: 10.1, DEFAULT: 10.1, incumbent: 10.15}
    assert winners_over(base, [POINTS[0], lent, incumbent], (0.0, 0.05, 0.1), lent=[lent],
                        incumbent=incumbent) == {incumbent}
    # 7% behind by its search time (outside the near-fastest window) but 2% side by side: a
    # finalist all the same, and named.
    base = {POINTS[0]: 10.0, DEFAULT: 12.0, incumbent: 10.7}
    runner = NoisyRunner(base, {incumbent: -0.5})
    result = run_study(qk.KERNEL, PLAN, DEFAULT, runner, budget=500, study_name="t",
                       incumbent=incumbent)
    assert result.winner.config == incumbent
    # Faster by more than the band, another point replaces it.
    base = {POINTS[0]: 10.0, DEFAULT: 12.0, incumbent: 10.5}
    assert winners_over(base, [POINTS[0], incumbent], (0.0, 0.02),
                        incumbent=incumbent) == {POINTS[0]}


def test_the_band_widens_with_the_fastest_finalists_spread():
    def outcome(config, median_us, iqr_us):
        return TrialOutcome(0, config, Measurement(median_us, iqr_us, 25), None,
                            PREDICTED[config])

    # A point 4% behind the fastest, first in the fixed order: tied only where the fastest's
    # IQR is wider than 4%.
    noisy = [outcome(POINTS[0], 10.4, 0.1), outcome(POINTS[1], 10.0, 0.5)]
    quiet = [outcome(POINTS[0], 10.4, 0.1), outcome(POINTS[1], 10.0, 0.05)]
    assert pick(noisy, DEFAULT).tie_band == pytest.approx(0.05)
    assert pick(noisy, DEFAULT).winner.config == POINTS[0]
    assert pick(quiet, DEFAULT).tie_band == pytest.approx(TIE_BAND_FLOOR) == 0.03
    assert pick(quiet, DEFAULT).winner.config == POINTS[1]
    assert tie_band(Measurement(10.0, 0.0, 25), floor=0.0) == 0.0


def test_finalists_do_not_depend_on_the_order_points_were_tried():
    """Equal search-time medians rank by the fixed order, not by trial number (which a fresh
    run's search changes)."""
    outcomes = [TrialOutcome(i, c, Measurement(10.0 if i < 5 else 12.0 + i, 0.01, 25), None,
                             1.0) for i, c in enumerate(p.config for p in PLAN.kept[:9])]
    for tried in (outcomes, outcomes[::-1], outcomes[2:] + outcomes[:2]):
        chosen = finalists(tried, DEFAULT, floor=0.0)
        assert [t.config for t in chosen] == [t.config for t in finalists(outcomes, DEFAULT,
                                                                          floor=0.0)]
    ranked = sorted((t for t in outcomes if t.measurement.median_us == 10.0),
                    key=lambda t: config_to_json(t.config))
    assert [t.config for t in chosen[:3]] == [t.config for t in ranked[:3]]


def test_the_preferred_near_fastest_point_is_remeasured_though_not_among_the_fastest():
    # Five points within 1% by their search times; the one the order puts first is the fifth
    # fastest, and re-measured it ties with the fastest.
    extra = next(p.config for p in PLAN.kept if p.config not in POINTS + [DEFAULT]
                 and order(p.config) > order(POINTS[0]))
    base = {POINTS[1]: 10.0, POINTS[2]: 10.02, POINTS[3]: 10.04, extra: 10.06,
            POINTS[0]: 10.08, DEFAULT: 12.0}
    runner = NoisyRunner(base, {})
    result = run_study(qk.KERNEL, PLAN, DEFAULT, runner, budget=500, study_name="t")
    (remeasured,) = runner.remeasured
    assert POINTS[0] in remeasured and DEFAULT in remeasured
    assert result.winner.config == POINTS[0]


def test_the_record_keeps_the_winners_own_times_and_the_study_its_finals(tmp_path):
    db = Database.open(f"sqlite:///{tmp_path / 'cutetune.db'}")
    base = {POINTS[0]: 10.0, DEFAULT: 10.1}
    runner = NoisyRunner(base, {POINTS[0]: -0.02, DEFAULT: 0.03})
    result = tune_bucket(plan_bucket(qk.KERNEL, STATIC, 1, SPEC, CEILINGS), runner, db,
                         FINGERPRINT, budget=500)
    assert result.winner.config == DEFAULT and result.tie_band == pytest.approx(TIE_BAND_FLOOR)
    (winner,) = winners(db, FINGERPRINT, "qk_norm")
    assert json.loads(winner.config_json) == json.loads(config_to_json(DEFAULT))
    assert winner.median_us == pytest.approx(10.13)  # the default's own, not 9.98
    frame = trials_frame(db, "qk_norm")
    default_row = frame[frame["config_json"] == config_to_json(DEFAULT)].iloc[0]
    assert default_row["median_us"] == pytest.approx(10.13)
    # The study keeps why: every finalist as re-measured, the band and the winner.
    study = optuna.load_study(study_name=result.study_name, storage=db.url)
    finals = study.user_attrs[FINALS_ATTR]
    assert finals["winner"] == config_to_json(DEFAULT)
    assert finals["incumbent"] is None  # none shipped for this problem
    assert finals["tie_band"] == pytest.approx(TIE_BAND_FLOOR)
    by_config = {f["config"]: f["median_us"] for f in finals["finalists"]}
    assert by_config[config_to_json(POINTS[0])] == pytest.approx(9.98)
    assert by_config[config_to_json(DEFAULT)] == pytest.approx(10.13)


def test_the_fixed_order_is_the_default_then_the_predicted_time_then_canonical_json():
    a, b = POINTS[:2]
    assert preference(DEFAULT, DEFAULT, 9.0) < preference(a, DEFAULT, 1.0)
    assert preference(a, DEFAULT, 1.0) < preference(b, DEFAULT, 1.1)
    assert preference(b, DEFAULT, 1.0) < preference(a, DEFAULT, 1.1)
    # Predictions equal to three significant digits (fresh runs measure the ceilings anew):
    # canonical JSON decides.
    first, second = sorted((a, b), key=config_to_json)
    assert preference(first, DEFAULT, 1.0004) < preference(second, DEFAULT, 0.9996)


def test_a_bad_tie_band_is_refused():
    with pytest.raises(ValueError, match="tie band must be a fraction from 0 to below 1"):
        run_study(qk.KERNEL, PLAN, DEFAULT, NoisyRunner({}, {}), budget=1, study_name="t",
                  tie_band=1.5)
