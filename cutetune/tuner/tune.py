"""One bucket's tuning end to end: plan, search, and store the result atomically."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import Lender, Plan, lent_configs, make_plan
from cutetune.device.roofline import achieved_gbps, percent_of_roofline, predict
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.registry import KernelDef
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    TrialRecord,
    TuningResult,
    record_tuning_result,
)
from cutetune.spaces.buckets import bucket_of
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json
from cutetune.tuner.finals import TIE_BAND_FLOOR
from cutetune.tuner.study import StudyResult, TrialOutcome, TrialRunner, run_study


@dataclass(frozen=True)
class BucketPlan:
    """What tuning one bucket starts from: the problem at the bucket's own token count (the
    size the dispatcher serves it for), the cost model's plan, the heuristic default, the
    points other problems' winners lend it, nearest first, and the incumbent, the problem's
    own shipped winner at the bucket (None where none is shipped; study.py, finals.py)."""

    kernel: KernelDef
    problem: Problem
    plan: Plan
    default: Any
    spec: DeviceSpec
    ceilings: Ceilings
    lent: tuple[Any, ...] = ()
    incumbent: Any = None

    @property
    def bucket(self) -> int:
        return self.problem.num_tokens


def bucket_key(planned: BucketPlan) -> tuple:
    """A bucket's name in a run: kernel, static problem, bucket (as a BucketSummary gives
    them)."""
    return planned.kernel.name, planned.problem.with_tokens(1), planned.bucket


def plan_bucket(kernel: KernelDef, static_problem: Problem, num_tokens: int, spec: DeviceSpec,
                ceilings: Ceilings, calibrated: CalibratedModel | None = None,
                lenders: Mapping[int, Mapping[Lender, Any]] | None = None,
                incumbents: Mapping[int, Mapping[Lender, Any]] | None = None) -> BucketPlan:
    """The plan of the bucket that serves `num_tokens`, ranked and pruned by `calibrated`
    (the device's fitted model) where given, else by the datasheet roofline; `lenders` are the
    kernel's stored winners by bucket and lender (funnel.lenders_by_bucket), `incumbents` its
    shipped ones alike, of which the problem's own is the incumbent; the plan keeps both."""
    problem = static_problem.with_tokens(bucket_of(num_tokens))
    default = kernel.default_config(problem, spec)
    kernel.space.check(problem, default, spec)
    lent = lent_configs(kernel, problem, spec, (lenders or {}).get(problem.num_tokens, {}))
    incumbent = (incumbents or {}).get(problem.num_tokens, {}).get(
        Lender(kernel.name, problem.static_key()))
    always_kept = lent if incumbent is None else (incumbent, *lent)
    return BucketPlan(kernel, problem,
                      make_plan(kernel, problem, spec, ceilings, calibrated, always_kept),
                      default, spec, ceilings, lent, incumbent)


def study_name(kernel: KernelDef, problem: Problem, fingerprint: DeviceFingerprint) -> str:
    """One study per (kernel, static problem, token bucket, device, kernel source), named
    kernel / problem / bucket / device / source."""

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    device = digest(repr(sorted(asdict(fingerprint).items())))
    return (f"{kernel.name} / {digest(problem.static_key())} / {problem.num_tokens} tokens / "
            f"{device} / {kernel.source_hash()[:8]}")


def bucket_study_names(kernel: KernelDef, static_problem: Problem, tokens: Sequence[int],
                       fingerprint: DeviceFingerprint) -> list[str]:
    """The study names of the buckets that serve `tokens`, without planning them."""
    return [study_name(kernel, static_problem.with_tokens(bucket_of(n)), fingerprint)
            for n in tokens]


def trial_record(planned: BucketPlan, outcome: TrialOutcome) -> TrialRecord:
    m = outcome.measurement
    cost = planned.kernel.cost(planned.problem, outcome.config, planned.spec)
    return TrialRecord(
        number=outcome.number,
        config_json=config_to_json(outcome.config),
        status="ok" if m else "failed",
        failure_reason=outcome.failure_reason,
        median_us=m.median_us if m else None,
        iqr_us=m.iqr_us if m else None,
        repeats=m.repeats if m else None,
        gbps=achieved_gbps(cost, m.median_us) if m else None,
        pct_roofline=(percent_of_roofline(cost, planned.spec, planned.ceilings, m.median_us)
                      if m else None),
        # The datasheet roofline's, whatever model ranked the search: the report sets the
        # calibrated model's prediction (recomputed from the point) beside it.
        predicted_us=predict(cost, planned.spec, planned.ceilings).predicted_us,
    )


def tune_bucket(planned: BucketPlan, runner: TrialRunner, db: Database,
                fingerprint: DeviceFingerprint, budget: int, seed: int = 0,
                storage: optuna.storages.BaseStorage | None = None,
                on_trial: Callable[[TrialOutcome], None] | None = None,
                excluded: Collection[Any] = (), retry_failed: bool = False,
                fresh: bool = False, tie_band: float = TIE_BAND_FLOOR) -> StudyResult:
    """Search the bucket and record every trial and the winner in one transaction.

    The bucket's Optuna study (in `storage`, else the results database) is continued where
    one is stored, or deleted first when `fresh`. `excluded` points are not tried;
    `tie_band` is the least band within which finalists are tied (finals.py)."""
    kernel, problem = planned.kernel, planned.problem
    name = study_name(kernel, problem, fingerprint)
    storage = storage if storage is not None else db.url
    if fresh and name in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        optuna.delete_study(study_name=name, storage=storage)
    result = run_study(kernel, planned.plan, planned.default, runner, budget, name,
                       storage=storage, seed=seed, on_trial=on_trial, excluded=excluded,
                       retry_failed=retry_failed, tie_band=tie_band, lent=planned.lent,
                       incumbent=planned.incumbent)
    # The winner's trial is stored with its own interleaved re-measurement (not the fastest
    # finalist's, where the tie band named another): the numbers the winner row carries.
    winner = result.winner.number if result.winner is not None else None
    records = tuple(trial_record(planned, result.winner if t.number == winner else t)
                    for t in result.trials)
    record_tuning_result(db, fingerprint, TuningResult(
        kernel_name=kernel.name, source_hash=kernel.source_hash(),
        static_key=problem.static_key(), bucket=problem.num_tokens,
        num_tokens=problem.num_tokens, study_name=result.study_name,
        started_at=result.started_at, finished_at=result.finished_at, trials=records,
        winner_number=winner))
    return result
