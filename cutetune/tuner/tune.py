"""One tuning run end to end: plan, search, and store the result atomically."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict

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
from cutetune.tuner.plan import make_plan
from cutetune.tuner.roofline import Ceilings, DeviceSpec, achieved_gbps, percent_of_roofline
from cutetune.tuner.study import StudyResult, TrialOutcome, TrialRunner, run_study


def study_name(kernel: KernelDef, problem: Problem, fingerprint: DeviceFingerprint) -> str:
    """One study per (kernel, static problem, token bucket, device)."""

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    device = digest(repr(sorted(asdict(fingerprint).items())))
    return (f"{kernel.name}:{digest(problem.static_key())}:b{bucket_of(problem.num_tokens)}:"
            f"{device}")


def trial_record(kernel: KernelDef, problem: Problem, spec: DeviceSpec, ceilings: Ceilings,
                 outcome: TrialOutcome) -> TrialRecord:
    m = outcome.measurement
    cost = kernel.cost(problem, outcome.config, spec)
    return TrialRecord(
        number=outcome.number,
        config_json=config_to_json(outcome.config),
        status="ok" if m else "failed",
        failure_reason=outcome.failure_reason,
        median_us=m.median_us if m else None,
        iqr_us=m.iqr_us if m else None,
        repeats=m.repeats if m else None,
        gbps=achieved_gbps(cost, m.median_us) if m else None,
        pct_roofline=percent_of_roofline(cost, spec, ceilings, m.median_us) if m else None,
        predicted_us=outcome.predicted_us,
    )


def tune_bucket(kernel: KernelDef, static_problem: Problem, num_tokens: int, spec: DeviceSpec,
                ceilings: Ceilings, runner_for: Callable[[Problem], TrialRunner], db: Database,
                fingerprint: DeviceFingerprint, budget: int, seed: int = 0,
                on_trial: Callable[[TrialOutcome], None] | None = None) -> StudyResult:
    """Tune `static_problem` for the bucket of `num_tokens` (measured at the bucket's own token
    count, the size the dispatcher serves it for) and record every trial and the winner."""
    bucket = bucket_of(num_tokens)
    problem = static_problem.with_tokens(bucket)
    plan = make_plan(kernel, problem, spec, ceilings)
    default = kernel.default_config(problem, spec)
    kernel.space.check(problem, default, spec)
    result = run_study(kernel, plan, default, runner_for(problem), budget,
                       study_name(kernel, problem, fingerprint), storage=db.url, seed=seed,
                       on_trial=on_trial)
    # The winner's trial is stored with its interleaved re-measurement: the numbers that named
    # it the winner, and the ones the winner row carries.
    winner = result.winner.number if result.winner is not None else None
    records = tuple(trial_record(kernel, problem, spec, ceilings,
                                 result.winner if t.number == winner else t)
                    for t in result.trials)
    record_tuning_result(db, fingerprint, TuningResult(
        kernel_name=kernel.name, source_hash=kernel.source_hash(),
        static_key=problem.static_key(), bucket=bucket, num_tokens=problem.num_tokens,
        study_name=result.study_name, started_at=result.started_at,
        finished_at=result.finished_at, trials=records, winner_number=winner))
    return result
