"""Tuning a whole model: every kernel it uses, every problem of each, every token bucket, in
one run that can be stopped at any moment and started again.

A bucket whose run is stored for the same kernel source and device (with at least the trials
asked for, or every candidate) is skipped unless forced. Any other bucket continues its Optuna
study, so a run killed in the middle of a bucket loses at most the trial in hand. A point that
hangs, crashes or loses the CUDA context is quarantined at once, in its own transaction, and
not tried again for that kernel source, problem and device unless asked to. Each bucket's
trials and winner are written in one transaction when the bucket ends: a bucket never holds a
winner without its trials.

With several GPU workers (one per GPU), each takes the next bucket left as it finishes one, in
a thread of its own: a bucket's trials and its finalists' re-measurement all run on one GPU,
so its winner is chosen among times of one device. The observer hears the workers one at a
time. Several runs on one database (processes, hosts) divide the buckets the same way: each
bucket is claimed in the database before it is tuned (bucket_claims.py), so each is searched
once, and a bucket a dead run held is finished by another.

The run reports what it does to an observer (the CLI's progress display), and returns one
summary row per problem and bucket (in the order the buckets were planned).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from optuna.storages import BaseStorage

from cutetune.build.interrupt import request_stop, safe_points
from cutetune.build.supervised import ProcessLost
from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import Lender, candidates_of, lenders_by_bucket
from cutetune.device.roofline import percent_of_roofline
from cutetune.device.specs import Ceilings, DeviceSpec, device_spec_for
from cutetune.kernels.registry import KernelDef
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    QuarantinedPoint,
    StoredRun,
    calibration_to_serve,
    clear_quarantine,
    latest_ceilings,
    quarantined_points,
    record_ceilings,
    record_quarantine,
    shipped_winners,
    stored_runs,
    winners_to_serve,
)
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json
from cutetune.tuner.bucket_claims import DEFAULT_LEASE_S, BucketClaims
from cutetune.tuner.eta import RunEta
from cutetune.tuner.finals import TIE_BAND_FLOOR
from cutetune.tuner.isolated import Workers
from cutetune.tuner.study import StudyResult, TrialOutcome, candidate_order, ranked_candidates
from cutetune.tuner.study_storage import fail_abandoned_in, open_storage
from cutetune.tuner.tune import BucketPlan, bucket_study_names, plan_bucket, tune_bucket

TUNED, STORED, NO_WINNER, FAILED = "tuned", "stored", "no winner", "failed"
# What device/ceilings.py measures (and Ceilings holds).
MEASURED_CEILINGS = {"copy_gbps", "launch_floor_us", "grid_barrier_us"}


@dataclass(frozen=True)
class Unit:
    """One of a model's kernel problems, tuned at every bucket of the run."""

    kernel: KernelDef
    problem: Problem  # the static problem


@dataclass(frozen=True)
class BucketSummary:
    """One line of the run's summary. `speedup` is the default's time over the winner's, both
    re-measured side by side."""

    kernel: str
    problem: Problem
    bucket: int
    status: str  # TUNED, STORED, NO_WINNER or FAILED
    winner_json: str | None
    median_us: float | None
    pct_roofline: float | None
    speedup: float | None
    trials: int
    failures: int
    note: str = ""


class Observer(Protocol):
    def started(self, fingerprint: DeviceFingerprint, ceilings: Ceilings,
                pending: Sequence[PendingBucket], skipped: int, eta: RunEta) -> None:
        """The device, its ceilings, the buckets to tune, how many are stored already, and the
        run's ETA (tuner/eta.py), which the run keeps current."""

    def bucket_started(self, planned: BucketPlan, expected_trials: int) -> None: ...

    def trial(self, planned: BucketPlan, outcome: TrialOutcome,
              best: TrialOutcome | None) -> None: ...

    def bucket_finished(self, summary: BucketSummary) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    budget: int
    seed: int = 0
    force: bool = False  # re-tune buckets already stored, from their first trial
    retry_failed: bool = False  # try quarantined points again
    tie_band: float = TIE_BAND_FLOOR  # the least band within which finalists tie (finals.py)
    lease_s: float = DEFAULT_LEASE_S  # how long a bucket's claim holds without a heartbeat


@dataclass(frozen=True)
class PendingBucket:
    """A bucket the run tunes: its plan, the trials it takes at most (budget or candidates),
    and the points quarantined when the run started."""

    planned: BucketPlan
    trials: int
    quarantined: frozenset[Any]


def tune_model(units: Sequence[Unit], buckets: Sequence[int], db: Database, workers: Workers,
               options: RunOptions, observer: Observer,
               storage: BaseStorage | None = None) -> list[BucketSummary]:
    """Tune every unit at every bucket with `workers` (started here), storing as it goes; the
    Optuna studies live in `storage`, by default the results database with heartbeats. Ctrl-C
    stops the run at its next safe point (interrupt.py), with KeyboardInterrupt."""
    with safe_points(), workers:
        fingerprint = workers.fingerprint
        spec = device_spec_for(fingerprint.gpu_name)
        measured = latest_ceilings(db, fingerprint)
        # A database from before a ceiling was measured (the grid barrier's) has it measured
        # now, beside the others.
        if not MEASURED_CEILINGS <= set(measured):
            fresh = workers.measure_ceilings()
            record_ceilings(db, fingerprint, fresh)
            measured = {**measured, **fresh}
        ceilings = Ceilings.from_measured(spec, measured)
        calibrated = calibration_to_serve(db, fingerprint)
        storage = storage if storage is not None else open_storage(db.url)

        summaries, pending = plan_run(units, buckets, db, fingerprint, spec, ceilings,
                                      calibrated, options)
        queued = _compile_ahead(workers, pending, options.budget)
        eta = RunEta.for_run(pending, queued, workers)
        observer = eta.updating(observer)
        observer.started(fingerprint, ceilings, pending, len(summaries), eta)
        tuned: list[BucketSummary | None] = [None] * len(pending)

        def done_elsewhere(index: int, bucket: PendingBucket, run: StoredRun) -> None:
            planned = bucket.planned
            tuned[index] = _stored_summary(Unit(planned.kernel, planned.problem.with_tokens(1)),
                                           run, "tuned by another process")
            observer.bucket_finished(tuned[index])

        claims = BucketClaims(db, fingerprint, pending, options.lease_s, done_elsewhere,
                              options.force)
        if len(workers.gpus) == 1:
            _work_through(claims, tuned, db, workers, storage, options, observer)
        else:
            _tune_in_parallel(claims, tuned, db, workers, storage, options,
                              _OneAtATime(observer))
        summaries += [summary for summary in tuned if summary is not None]
        # No study of the run's buckets keeps a trial of a dead process RUNNING, those of the
        # buckets found stored included, whose studies the run did not open (study_storage.py).
        fail_abandoned_in(storage, (name for unit in units for name in bucket_study_names(
            unit.kernel, unit.problem, buckets, fingerprint)))
        return summaries


def _work_through(claims: BucketClaims, tuned: list[BucketSummary | None], db: Database,
                  workers: Workers, storage: BaseStorage, options: RunOptions,
                  observer: Observer, gpu: int = 0) -> None:
    """Tune the buckets `claims` hands this GPU worker until none is left, each summary at its
    bucket's index in `tuned`."""
    while (taken := claims.take()) is not None:
        observer.bucket_started(taken.bucket.planned, taken.bucket.trials)
        with claims.holding(taken):
            tuned[taken.index] = _tune_one(taken.bucket.planned, db, workers, storage, options,
                                           observer, gpu)


def _tune_in_parallel(claims: BucketClaims, tuned: list[BucketSummary | None], db: Database,
                      workers: Workers, storage: BaseStorage, options: RunOptions,
                      observer: Observer) -> None:
    """The buckets of `claims` tuned by a thread per GPU worker, each taking the next bucket
    left. A thread's error (Ctrl-C at a safe point among them) stops the others at their next
    safe point, and is raised here once all have stopped."""
    errors: list[BaseException] = []

    def work(gpu: int) -> None:
        try:
            _work_through(claims, tuned, db, workers, storage, options, observer, gpu)
        except BaseException as error:  # noqa: BLE001 - raised again in the run's thread
            errors.append(error)
            request_stop()

    threads = [threading.Thread(target=work, args=(gpu,), name=f"cutetune-gpu-{gpu}")
               for gpu in range(len(workers.gpus))]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)
    if errors:
        raise errors[0]


class _OneAtATime:
    """An observer that hears one worker at a time."""

    def __init__(self, observer: Observer):
        self._observer = observer
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        method = getattr(self._observer, name)

        def serialized(*arguments):
            with self._lock:
                return method(*arguments)

        return serialized


def plan_run(units: Sequence[Unit], buckets: Sequence[int], db: Database,
             fingerprint: DeviceFingerprint, spec: DeviceSpec, ceilings: Ceilings,
             calibrated: CalibratedModel | None, options: RunOptions
             ) -> tuple[list[BucketSummary], list[PendingBucket]]:
    """The summaries of the buckets stored already, and the buckets left to tune. A bucket
    counts as stored when its latest run took the trials asked for, or every candidate."""
    stored_summaries, pending = [], []
    # What the stored winners of problems outside the run lend, by kernel: never the run's own
    # problems', which would make one bucket's search depend on another's outcome, and a
    # resumed run lend what the interrupted one did not. The run's own problems' shipped
    # winners, package data alike in every run, are their incumbents (finals.py).
    own = {(unit.kernel.name, unit.problem.static_key()) for unit in units}
    shipped = shipped_winners(fingerprint)
    stored_winners = [w for w in [*shipped, *winners_to_serve(db, fingerprint)]
                      if (w.kernel_name, w.static_key) not in own]
    shipped_own = [w for w in shipped if (w.kernel_name, w.static_key) in own]
    lenders: dict[str, dict[int, dict[Lender, Any]]] = {}
    incumbents: dict[str, dict[int, dict[Lender, Any]]] = {}
    for unit in units:
        if unit.kernel.name not in lenders:
            lenders[unit.kernel.name] = lenders_by_bucket(unit.kernel, stored_winners, spec)
            incumbents[unit.kernel.name] = lenders_by_bucket(unit.kernel, shipped_own, spec)
        source, static_key = unit.kernel.source_hash(), unit.problem.static_key()
        if options.retry_failed:
            clear_quarantine(db, fingerprint, unit.kernel.name, source, static_key)
        stored = stored_runs(db, fingerprint, unit.kernel.name, source, static_key)
        quarantined = frozenset(_quarantined(db, fingerprint, unit))
        for bucket in buckets:
            planned = plan_bucket(unit.kernel, unit.problem, bucket, spec, ceilings, calibrated,
                                  lenders[unit.kernel.name], incumbents[unit.kernel.name])
            trials = min(options.budget,
                         len(candidates_of(planned.plan, planned.default, quarantined)))
            run = stored.get(planned.bucket)
            if run is not None and run.trials >= trials and not options.force:
                stored_summaries.append(_stored_summary(unit, run))
            else:
                pending.append(PendingBucket(planned, trials, quarantined))
    return stored_summaries, pending


def compile_order(pending: Sequence[PendingBucket], budget: int
                  ) -> Iterator[tuple[int, bool, list[Any]]]:
    """What a run compiles ahead of the GPU, in the order it queues it: first every bucket's
    warm start, in the order the buckets are tuned, then every other candidate TPE may
    propose, best-ranked first; as (the bucket's index, in its warm start, its points)."""
    for warm_start_only in (True, False):
        for index, bucket in enumerate(pending):
            plan, default = bucket.planned.plan, bucket.planned.default
            order = (candidate_order(plan, default, budget, lent=bucket.planned.lent,
                                     incumbent=bucket.planned.incumbent)
                     if warm_start_only
                     else ranked_candidates(plan, default))
            yield index, warm_start_only, [c for c in order if c not in bucket.quarantined]


def _compile_ahead(workers: Workers, pending: Sequence[PendingBucket],
                   budget: int) -> list[tuple[int, bool, Future]]:
    """Queue `compile_order`'s points. Returns what it queued, in order, for the ETA: (the
    bucket's index, in its warm start, future)."""
    queued = []
    for index, warm_start_only, points in compile_order(pending, budget):
        planned = pending[index].planned
        futures = workers.compile_ahead(planned.kernel, planned.problem, points)
        queued += [(index, warm_start_only, future) for future in futures]
    return queued


def _quarantined(db: Database, fingerprint: DeviceFingerprint, unit: Unit) -> set[Any]:
    return {unit.kernel.space.config_from_dict(json.loads(point.config_json))
            for _, point in quarantined_points(db, fingerprint, unit.kernel.name,
                                               unit.kernel.source_hash(),
                                               unit.problem.static_key())}


def _tune_one(planned: BucketPlan, db: Database, workers: Workers, storage: BaseStorage,
              options: RunOptions, observer: Observer, gpu: int = 0) -> BucketSummary:
    kernel, problem = planned.kernel, planned.problem
    fingerprint = workers.fingerprint
    unit = Unit(kernel, problem.with_tokens(1))
    best: list[TrialOutcome] = []

    def on_trial(outcome: TrialOutcome) -> None:
        if outcome.took_process_down:
            record_quarantine(db, fingerprint, QuarantinedPoint(
                kernel.name, kernel.source_hash(), problem.static_key(),
                config_to_json(outcome.config), planned.bucket, outcome.failure_reason,
                datetime.now(UTC)))
        if outcome.ok and (not best or outcome.measurement.median_us
                           < best[0].measurement.median_us):
            best[:] = [outcome]
        observer.trial(planned, outcome, best[0] if best else None)

    excluded = () if options.retry_failed else _quarantined(db, fingerprint, unit)
    runner = workers.runner(kernel, problem, planned.spec, planned.ceilings, gpu)
    try:
        result = tune_bucket(planned, runner, db, fingerprint, options.budget, options.seed,
                             storage=storage, on_trial=on_trial, excluded=excluded,
                             retry_failed=options.retry_failed, fresh=options.force,
                             tie_band=options.tie_band)
    except ProcessLost as lost:  # the finalists' re-measurement lost the worker
        summary = BucketSummary(kernel.name, unit.problem, planned.bucket, FAILED, None, None,
                                None, None, 0, 0, f"re-measuring the finalists: {lost}")
    else:
        summary = _tuned_summary(planned, result)
    observer.bucket_finished(summary)
    return summary


def _tuned_summary(planned: BucketPlan, result: StudyResult) -> BucketSummary:
    failures = sum(1 for t in result.trials if not t.ok)
    static = planned.problem.with_tokens(1)
    winner = result.winner
    if winner is None:
        reason = result.trials[0].failure_reason if result.trials else "no candidate"
        return BucketSummary(planned.kernel.name, static, planned.bucket, NO_WINNER, None, None,
                             None, None, len(result.trials), failures, f"first failure: {reason}")
    us = winner.measurement.median_us
    cost = planned.kernel.cost(planned.problem, winner.config, planned.spec)
    default = result.default
    speedup = default.measurement.median_us / us if default is not None and default.ok else None
    note = f"resumed {result.resumed} trials" if result.resumed else ""
    return BucketSummary(planned.kernel.name, static, planned.bucket, TUNED,
                         config_to_json(winner.config), us,
                         percent_of_roofline(cost, planned.spec, planned.ceilings, us), speedup,
                         len(result.trials), failures, note)


def _stored_summary(unit: Unit, run: StoredRun, note: str = "stored earlier") -> BucketSummary:
    winner = run.winner
    return BucketSummary(unit.kernel.name, unit.problem, run.bucket,
                         STORED if winner is not None else NO_WINNER,
                         winner.config_json if winner else None,
                         winner.median_us if winner else None,
                         winner.pct_roofline if winner else None, None, run.trials, run.failed,
                         note)
