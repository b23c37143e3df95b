"""The whole search on the CPU: a fake runner stands in for compile, verify and time."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cutetune.device.funnel import Lender, make_plan
from cutetune.device.measure import Measurement
from cutetune.kernels import qk_norm as qk
from cutetune.results_db import Database, trials_frame, winners
from cutetune.spaces.models import load_model
from cutetune.tuner import model_run
from cutetune.tuner.finals import preference
from cutetune.tuner.study import (
    WARM_START_SHARE,
    TrialFailure,
    candidate_order,
    ranked_candidates,
    run_study,
)
from cutetune.tuner.tune import plan_bucket, tune_bucket
from testkit.fake_qk_runner import CEILINGS, FINGERPRINT, SPEC, FakeRunner
from testkit.stored_winners import winner


def _plan(tokens):
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    problem = static.with_tokens(tokens)
    return problem, make_plan(qk.KERNEL, problem, SPEC, CEILINGS)


def test_exhaustive_when_candidates_fit_the_budget():
    problem, plan = _plan(1)
    runner = FakeRunner()
    default = qk.default_config(problem, SPEC)
    result = run_study(qk.KERNEL, plan, default, runner, budget=500, study_name="t")
    assert result.exhaustive
    assert len(result.trials) == len(plan.kept) == len(set(runner.measured))
    assert runner.measured[0] == default  # warm start: the heuristic first
    verified = [c for c in runner.measured if c.vector_bits != 32]
    best_us = min(map(FakeRunner.time_of, verified))
    # Several points share the best time: the fixed order names one of them.
    tied = [c for c in verified if FakeRunner.time_of(c) == best_us]
    assert len(tied) > 1
    predicted = {p.config: p.prediction.predicted_us for p in plan.kept}
    assert result.winner.config == min(tied, key=lambda c: preference(c, default, predicted[c]))
    assert result.winner.measurement.repeats == 3  # the interleaved re-measurement
    failed = [t for t in result.trials if not t.ok]
    assert failed and all("wrong result" in t.failure_reason for t in failed)


def test_budget_bounds_measurements_and_warm_start_comes_first(tmp_path):
    problem, plan = _plan(4096)
    runner = FakeRunner()
    default = qk.default_config(problem, SPEC)
    result = run_study(qk.KERNEL, plan, default, runner, budget=10, study_name="t",
                       storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert not result.exhaustive
    assert len(result.trials) == 10 == len(set(runner.measured))
    assert runner.measured[0] == default
    assert runner.measured[1] == plan.kept[0].config or plan.kept[0].config == default
    kept = {p.config for p in plan.kept} | {default}
    assert set(runner.measured) <= kept  # nothing outside the pruned space is timed


def test_a_warm_start_share_of_one_spends_the_budget_on_the_ranked_points():
    problem, plan = _plan(4096)
    default = qk.default_config(problem, SPEC)
    ranked = ranked_candidates(plan, default)
    assert len(ranked) > 10
    assert candidate_order(plan, default, 10) == ranked[:1] + [
        c for c in [p.config for p in plan.kept[:10 // WARM_START_SHARE]] if c != default]
    assert candidate_order(plan, default, 10, warm_start_share=1) == ranked[:10]
    runner = FakeRunner()
    result = run_study(qk.KERNEL, plan, default, runner, budget=10, study_name="t",
                       warm_start_share=1)
    assert runner.measured[:10] == ranked[:10]  # no point of TPE's: the same in every run
    assert len(result.trials) == 10
    with pytest.raises(ValueError, match="the warm start's share must be at least 1, got 0"):
        run_study(qk.KERNEL, plan, default, runner, budget=10, study_name="u",
                  warm_start_share=0)


def test_lent_points_the_roofline_kept_follow_the_default_in_the_warm_start():
    problem, plan = _plan(4096)
    default = qk.default_config(problem, SPEC)
    kept = [p.config for p in plan.kept if p.config != default]
    lent = [kept[-1], kept[-2]]  # the roofline's last-ranked: in no head of the ranking
    pruned = [p.config for p in plan.pruned]
    order = candidate_order(plan, default, 10, lent=lent + pruned[:1])
    assert order[:3] == [default, *lent] and len(order) <= 10
    assert not set(pruned) & set(order)
    runner = FakeRunner()
    run_study(qk.KERNEL, plan, default, runner, budget=10, study_name="t", lent=lent)
    assert runner.measured[:3] == [default, *lent]


def test_a_bucket_is_lent_the_other_problems_winners_nearest_first():
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    near, far = (dataclasses.replace(static, q_heads=h) for h in (24, 64))
    small = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
    large = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)
    lenders = {8: {Lender(qk.KERNEL.name, far.static_key()): large,
                   Lender(qk.KERNEL.name, near.static_key()): small,
                   Lender(qk.KERNEL.name, static.static_key()): large}}  # its own lends nothing
    assert plan_bucket(qk.KERNEL, static, 8, SPEC, CEILINGS, lenders=lenders).lent == (
        small, large)
    assert plan_bucket(qk.KERNEL, static, 64, SPEC, CEILINGS, lenders=lenders).lent == ()


def test_a_run_is_lent_the_winners_stored_and_shipped_before_it(tmp_path, monkeypatch):
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    stored, shipped = (dataclasses.replace(static, q_heads=h) for h in (24, 64))
    small = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
    large = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)
    also_tuned = dataclasses.replace(static, q_heads=40)  # a problem of the run: lends nothing
    monkeypatch.setattr(model_run, "winners_to_serve", lambda db, here: [
        winner(qk.KERNEL, stored, 8, small), winner(qk.KERNEL, also_tuned, 8, small)])
    monkeypatch.setattr(model_run, "shipped_winners",
                        lambda here: [winner(qk.KERNEL, shipped, 8, large)])
    db = Database.open(f"sqlite:///{tmp_path / 'results.db'}")
    units = [model_run.Unit(qk.KERNEL, p) for p in (static, also_tuned)]
    _, pending = model_run.plan_run(units, [8, 64], db, FINGERPRINT, SPEC, CEILINGS, None,
                                    model_run.RunOptions(budget=16))
    assert [b.planned.lent for b in pending] == [(small, large), (), (small, large), ()]


def test_a_problems_own_shipped_winner_is_its_incumbent_and_lends_nothing(tmp_path,
                                                                         monkeypatch):
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    small = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
    large = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)
    # The database's winner of the problem is the last run's outcome: neither lent nor kept.
    monkeypatch.setattr(model_run, "winners_to_serve",
                        lambda db, here: [winner(qk.KERNEL, static, 8, small)])
    monkeypatch.setattr(model_run, "shipped_winners",
                        lambda here: [winner(qk.KERNEL, static, 8, large)])
    db = Database.open(f"sqlite:///{tmp_path / 'results.db'}")
    _, pending = model_run.plan_run([model_run.Unit(qk.KERNEL, static)], [8, 64], db,
                                    FINGERPRINT, SPEC, CEILINGS, None,
                                    model_run.RunOptions(budget=16))
    assert [(b.planned.incumbent, b.planned.lent) for b in pending] == [(large, ()), (None, ())]
    assert large in {p.config for p in pending[0].planned.plan.kept}


def test_the_incumbent_is_tried_after_the_default_and_wins_its_ties():
    problem, plan = _plan(4096)
    default = qk.default_config(problem, SPEC)
    kept = [p.config for p in plan.kept if p.config != default]
    incumbent, lent = kept[-1], [kept[-2]]  # the roofline's last-ranked: in no head
    assert candidate_order(plan, default, 10, lent=lent, incumbent=incumbent)[:3] == [
        default, incumbent, *lent]

    class AllTied(FakeRunner):
        def measure(self, config):
            return Measurement(10.0, 0.0, 1)

        def remeasure(self, configs):
            return [Measurement(10.0, 0.0, 3) for _ in configs]

    result = run_study(qk.KERNEL, plan, default, AllTied(), budget=10, study_name="t",
                       lent=lent, incumbent=incumbent)
    assert result.winner.config == incumbent


def test_every_point_failing_names_no_winner():
    problem, plan = _plan(8)

    class Failing(FakeRunner):
        def measure(self, config):
            raise TrialFailure("compile failed: boom")

    result = run_study(qk.KERNEL, plan, qk.default_config(problem, SPEC), Failing(), budget=5,
                       study_name="t")
    assert result.winner is None and len(result.trials) == 5


def test_bad_budget_is_rejected():
    problem, plan = _plan(8)
    with pytest.raises(ValueError, match="budget"):
        run_study(qk.KERNEL, plan, qk.default_config(problem, SPEC), FakeRunner(), budget=0,
                  study_name="t")


def test_tune_bucket_stores_trials_and_winner_with_optuna_in_the_same_db(tmp_path):
    db = Database.open(f"sqlite:///{tmp_path / 'cutetune.db'}")
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    result = tune_bucket(plan_bucket(qk.KERNEL, static, 3, SPEC, CEILINGS), FakeRunner(), db,
                         FINGERPRINT, budget=12)
    (winner,) = winners(db, FINGERPRINT, "qk_norm")
    assert winner.bucket == 4  # 3 tokens are served by the 4-token bucket
    assert json.loads(winner.config_json)["vector_bits"] != 32
    assert winner.median_us == pytest.approx(result.winner.measurement.median_us)
    frame = trials_frame(db, "qk_norm")
    assert len(frame) == 12 and (frame["status"] == "failed").any()
    assert frame.loc[frame["status"] == "ok", "pct_roofline"].gt(0).all()
    # The Optuna study lives in the same database, under its deterministic name.
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(db.url)]
    assert names == [result.study_name]
    # Tuning the bucket again continues its study: no point is timed again.
    again = FakeRunner()
    tune_bucket(plan_bucket(qk.KERNEL, static, 4, SPEC, CEILINGS), again, db, FINGERPRINT,
                budget=12)
    assert again.measured == [] and len(again.remeasured) == 1
    assert len(optuna.get_all_study_summaries(db.url)) == 1
    # ... unless asked to start afresh.
    fresh = FakeRunner()
    tune_bucket(plan_bucket(qk.KERNEL, static, 4, SPEC, CEILINGS), fresh, db, FINGERPRINT,
                budget=12, fresh=True)
    assert len(fresh.measured) == 12
    study = optuna.load_study(study_name=result.study_name, storage=db.url)
    assert len([t for t in study.trials if t.state.is_finished()]) >= 12


def test_the_default_is_always_remeasured_beside_the_finalists():
    problem, plan = _plan(64)
    default = qk.default_config(problem, SPEC)

    class DefaultLooksSlow(FakeRunner):
        """The default's first timing came at a slow moment; side by side it is the best."""

        def measure(self, config):
            measured = super().measure(config)
            if config == default:
                return Measurement(measured.median_us + 100.0, 0.1, 25)
            return measured

        def remeasure(self, configs):
            self.remeasured.append(list(configs))
            return [Measurement(1.0 if c == default else 5.0, 0.05, 3) for c in configs]

    runner = DefaultLooksSlow()
    result = run_study(qk.KERNEL, plan, default, runner, budget=500, study_name="t")
    (finalists,) = runner.remeasured
    assert len(finalists) == 4 and finalists[-1] == default
    assert result.winner.config == default


class _FormRunner:
    """Time by form and knobs, for a study over moe_dispatch's forms."""

    def __init__(self):
        self.measured = []

    @staticmethod
    def time_of(config) -> float:
        by_form = {"split": 10.0, "split_block_ranks": 9.0, "split_bulk": 12.0}
        return by_form.get(config.form, 20.0) + config.warps_per_block * 0.1

    def measure(self, config):
        self.measured.append(config)
        return Measurement(self.time_of(config), 0.1, 25)

    def remeasure(self, configs):
        return [Measurement(self.time_of(c), 0.05, 3) for c in configs]


def test_a_study_over_forms_samples_each_forms_own_knobs_and_resumes(tmp_path):
    from cutetune.kernels import moe_dispatch as md

    (static,) = md.KERNEL.problems_for_model(load_model("mixtral-8x7b"), "bfloat16")
    problem = static.with_tokens(4096)
    plan = make_plan(md.KERNEL, problem, SPEC, CEILINGS)
    default = md.default_config(problem, SPEC)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = _FormRunner()
    result = run_study(md.KERNEL, plan, default, first, budget=24, study_name="forms",
                       storage=storage)
    kept = {p.config for p in plan.kept} | {default}
    assert len(first.measured) == 24 == len(set(first.measured))
    assert set(first.measured) <= kept
    assert len({c.form for c in first.measured}) > 1
    assert result.winner.config == min(first.measured, key=_FormRunner.time_of)
    # A second process finds every trial stored: nothing is timed again.
    again = _FormRunner()
    resumed = run_study(md.KERNEL, plan, default, again, budget=24, study_name="forms",
                        storage=storage)
    assert again.measured == [] and resumed.resumed == 24
    assert {t.config for t in resumed.trials} == set(first.measured)
