"""Replayed searches (issue 42 items 2 and 6): the tuner's plan and study over stored times, and
the pruning, search and zero-shot metrics, on a space whose answer is known: rmsnorm's points
for qwen3-8b at 32768 tokens, timed by a known cost model."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cutetune.device.funnel import Lender, make_plan
from cutetune.device.measure import Measurement
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.registry import get_kernel
from cutetune.spaces.models import load_model
from cutetune.tuner import replay
from cutetune.tuner.replay import (
    BucketReplay,
    FreshRunRunner,
    ReplayRunner,
    RunNoise,
    fresh_runs,
    replay_bucket,
    summarize,
    trials_to_band,
)
from cutetune.tuner.study import TrialFailure, run_study
from testkit.known_cost_model import KNOWN

SPEC = DEVICE_SPECS["H200"]
CEILINGS = Ceilings.from_datasheet(SPEC)
KERNEL = get_kernel("rmsnorm")
PROBLEM = KERNEL.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0].with_tokens(32768)


@pytest.fixture(scope="module")
def plan():
    return make_plan(KERNEL, PROBLEM, SPEC, CEILINGS, KNOWN)


def known_times(plan) -> dict:
    return {p.config: KNOWN.predict_us(p.cost, SPEC) for p in plan.kept + plan.pruned}


def test_trials_to_band_counts_up_to_the_first_trial_within_it():
    assert trials_to_band([5.0, None, 3.05, 3.0], 3.0) == 3
    assert trials_to_band([5.0, None, 3.07, 3.0], 3.0) == 4
    assert trials_to_band([5.0, None], 3.0) is None


def test_the_replay_runner_answers_with_stored_times_and_fails_the_rest():
    runner = ReplayRunner({"a": 2.0, "b": None})
    assert runner.measure("a").median_us == 2.0
    assert [m.median_us for m in runner.remeasure(["a", "a"])] == [2.0, 2.0]
    with pytest.raises(TrialFailure, match="failed when measured"):
        runner.measure("b")
    with pytest.raises(TrialFailure, match="not measured"):
        runner.measure("c")


def top_pick(times: dict, model) -> object:
    """What serving picks: the best prediction, unless the heuristic's default is predicted
    within the model's band of it (times are the predictions here, the hidden point aside)."""
    default = KERNEL.default_config(PROBLEM, SPEC)
    predicted = {c: model.predict_us(KERNEL.cost(PROBLEM, c, SPEC), SPEC) for c in times}
    best = min(predicted, key=predicted.get)
    return default if predicted[default] <= predicted[best] * model.prune_factor else best


def test_a_model_that_is_right_keeps_the_best_and_finds_it_at_once(plan):
    times = known_times(plan)
    replay = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN)
    best = min(times.values())
    assert replay.valid == len(times) == len(plan.kept) + len(plan.pruned)
    assert replay.kept == len(plan.kept) == sum(t <= best * 1.2 for t in times.values())
    assert replay.kept_fraction == len(plan.kept) / len(times) < 1
    assert replay.best_us == best and replay.regret == 0.0
    assert replay.zero_shot_gap == pytest.approx(times[top_pick(times, KNOWN)] / best - 1)
    # The study times the default first, then the best-ranked point: the best.
    assert replay.trials_to_band in (1, 2)
    assert replay.search_fraction == replay.trials_to_band / len(times)
    assert replay.trials == 16  # the default budget, fewer than the candidates


def test_a_model_without_a_band_picks_the_best_it_predicts():
    sure = dataclasses.replace(KNOWN, prune_factor=1.0)
    plan = make_plan(KERNEL, PROBLEM, SPEC, CEILINGS, sure)
    replay = replay_bucket(KERNEL, PROBLEM, known_times(plan), SPEC, CEILINGS, sure)
    assert replay.zero_shot_gap == 0.0


def test_a_best_point_the_model_prunes_is_regret_and_a_zero_shot_miss(plan):
    times = known_times(plan)
    hidden = plan.pruned[-1].config  # predicted slowest, measured twice as fast as any
    times[hidden] = min(times.values()) / 2
    replay = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN)
    assert replay.best_us == times[hidden]
    assert replay.regret == pytest.approx(1.0)
    pick = top_pick(times, KNOWN)
    assert replay.zero_shot_gap == pytest.approx(times[pick] / times[hidden] - 1)
    assert replay.zero_shot_gap >= 1.0
    assert replay.trials_to_band is None and replay.search_fraction == math.inf


def test_failed_and_missing_points_are_not_the_best():
    sure = dataclasses.replace(KNOWN, prune_factor=1.0)
    plan = make_plan(KERNEL, PROBLEM, SPEC, CEILINGS, sure)
    times = known_times(plan)
    best = min(times, key=times.get)
    times[best] = None  # failed: the next fastest is the best
    del times[plan.pruned[0].config]  # never measured
    replay = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, sure)
    assert replay.best_us == min(t for t in times.values() if t is not None)
    assert replay.top_pick_us is None and replay.zero_shot_gap == math.inf


def test_without_a_calibration_the_datasheet_plan_is_replayed(plan):
    times = known_times(plan)
    replay = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, None)
    datasheet = make_plan(KERNEL, PROBLEM, SPEC, CEILINGS)
    assert replay.kept == len(datasheet.kept)
    assert replay.top_pick_us == times[datasheet.kept[0].config]


def test_a_lent_winner_valid_here_is_the_top_pick_and_the_models_pick_stays(plan):
    times = known_times(plan)
    alone = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN)
    slowest = max((c for c in times if times[c] is not None), key=times.get)
    other = dataclasses.replace(PROBLEM, hidden=2 * PROBLEM.hidden).static_key()
    lent = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN,
                         lenders={Lender(KERNEL.name, other): slowest,
                                  Lender(KERNEL.name, PROBLEM.static_key()): slowest})
    assert lent.top_pick_us == times[slowest] > alone.top_pick_us
    assert lent.model_pick_us == alone.model_pick_us == alone.top_pick_us
    # Its own winner is never lent to a problem: alone, it lends nothing.
    own = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN,
                        lenders={Lender(KERNEL.name, PROBLEM.static_key()): slowest})
    assert own.top_pick_us == alone.top_pick_us


def test_no_stored_time_is_one_clear_error():
    with pytest.raises(ValueError, match="no valid point of rmsnorm .* has a stored time"):
        replay_bucket(KERNEL, PROBLEM, {}, SPEC, CEILINGS, KNOWN)


def test_summarize_takes_medians_maxima_and_shares():
    replays = [BucketReplay(100, 10, 1.0, 1.0, 16, 5, 1.0, 1.1),  # kept 10%, found at 5%
               BucketReplay(100, 30, 1.0, 1.02, 16, None, 1.05, 1.0),  # 2% regret, never found
               BucketReplay(50, 10, 2.0, 2.0, 16, 25, 2.02, None)]  # kept 20%, found at 50%
    summary = summarize(replays)
    assert summary.buckets == 3
    assert summary.median_kept_fraction == 0.2
    assert summary.max_regret == pytest.approx(0.02)
    assert summary.median_regret == 0.0
    assert summary.within_regret_band == pytest.approx(2 / 3)
    assert summary.median_search_fraction == 0.5
    assert summary.zero_shot_within_band == pytest.approx(2 / 3)
    assert summary.model_pick_within_band == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="no bucket"):
        summarize([])


def test_a_fresh_run_reads_each_point_through_its_own_drift():
    times = {"a": 2.0, "b": 3.0}
    assert FreshRunRunner(times, RunNoise(0.0, 0.0), run=0).measure("a") == Measurement(
        2.0, 0.0, 1)
    drifting = RunNoise(drift=0.05, jitter=0.0)
    run0, again, run1 = (FreshRunRunner(times, drifting, run) for run in (0, 0, 1))
    first = run0.measure("a").median_us
    assert first != 2.0
    assert run0.remeasure(["a"])[0].median_us == first  # its finals read its search's drift
    assert again.measure("a").median_us == first  # a run replays alike whenever it is made
    assert run1.measure("a").median_us != first
    assert run0.measure("b").median_us / 3.0 != first / 2.0  # each point drifts on its own
    jittery = FreshRunRunner(times, RunNoise(drift=0.0, jitter=0.01), run=0)
    readings = [jittery.measure("a") for _ in range(2)]
    assert readings[0].median_us != readings[1].median_us
    assert readings[0].iqr_us == pytest.approx(readings[0].median_us * 1.349 * 0.01)


def test_fresh_runs_name_one_winner_without_noise_and_several_with_it(plan):
    times = known_times(plan)
    still = fresh_runs(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN, RunNoise(0.0, 0.0), 3)
    assert still.one_winner and still.spread == 0.0
    assert len(still.winners) == 3
    # Drifts far wider than the band: the runs' searches and finals read different points
    # fastest, each run's winner is one of the stored times.
    noisy = fresh_runs(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN, RunNoise(0.2, 0.0), 5,
                       tie_band=0.0)
    assert not noisy.one_winner and noisy.spread > 0
    assert noisy.winner_us == tuple(times[c] for c in noisy.winners)


def test_shipped_first_offers_one_more_runs_winner_to_every_run_as_its_incumbent(
        plan, monkeypatch):
    times = known_times(plan)
    studies = []

    def recorded(kernel, plan, default, runner, *args, **kwargs):
        result = run_study(kernel, plan, default, runner, *args, **kwargs)
        studies.append((runner.run, kwargs["incumbent"], result.winner.config,
                        {p.config for p in plan.kept}))
        return result

    monkeypatch.setattr(replay, "run_study", recorded)
    runs = fresh_runs(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN, RunNoise(0.05, 0.0), 3,
                      shipped_first=True)
    (shipping, *fresh) = studies
    assert shipping[:2] == (3, None)  # a run of its own draws, offered none
    assert [s[:2] for s in fresh] == [(run, shipping[2]) for run in range(3)]
    assert all(shipping[2] in kept for *_, kept in fresh)
    assert runs.winners == tuple(s[2] for s in fresh)


def test_a_lent_point_is_kept_timed_first_and_ends_the_regret(plan):
    times = known_times(plan)
    hidden = plan.pruned[-1].config  # the model prunes it; another problem's winner
    times[hidden] = min(times.values()) / 2
    other = dataclasses.replace(PROBLEM, hidden=2 * PROBLEM.hidden).static_key()
    lent = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN,
                         lenders={Lender(KERNEL.name, other): hidden})
    alone = replay_bucket(KERNEL, PROBLEM, times, SPEC, CEILINGS, KNOWN)
    assert lent.kept == alone.kept + 1
    assert lent.regret == 0.0 and alone.regret == pytest.approx(1.0)
    # The study times it right after the default, as the tuner's does.
    assert lent.trials_to_band == 2
