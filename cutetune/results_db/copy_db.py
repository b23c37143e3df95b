"""Whole results moved between databases (a team's PostgreSQL to an engine host's SQLite file,
and back): each winner with the run that named it, every trial of that run, and the ceilings
of its device, with their fingerprints and kernel source hashes as they were stored.

A run is stored at most once: one whose kernel source, problem, device, bucket, study and
start and end times the target holds already is skipped (copying a file twice, or a database
into one that holds some of its runs, stores nothing twice); so is a ceiling of the same device,
name and time. A copied run's winner takes its bucket by the rule every run follows
(queries.record_tuning_result).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import _device_id, _fingerprint, _record_run
from cutetune.results_db.records import TrialRecord, TuningResult
from cutetune.results_db.schema import (
    CeilingRow,
    DeviceRow,
    KernelRow,
    ProblemRow,
    TrialRow,
    TuningRunRow,
    WinnerRow,
)
from cutetune.results_db.session import Database

# (fingerprint, kernel name, source hash, static key, bucket): a winner's key.
WinnerKey = tuple[DeviceFingerprint, str, str, str, int]


@dataclass(frozen=True)
class CopyCounts:
    runs: int  # runs stored, each with its trials and its winner
    trials: int
    ceilings: int
    duplicate_runs: int  # held by the target already: skipped
    duplicate_ceilings: int


def copy_results(source: Database, target: Database,
                 keep: Callable[[WinnerKey], bool] = lambda key: True) -> CopyCounts:
    """Copy the winners of `source` that `keep` accepts, with their runs, trials and their
    devices' ceilings, into `target` in one transaction."""
    runs, ceilings = _read(source, keep)
    with target.session() as session:
        new_runs = [(fingerprint, run) for fingerprint, run in runs
                    if not _holds_run(session, fingerprint, run)]
        for fingerprint, run in new_runs:
            _record_run(session, fingerprint, run)
        new_ceilings = [(fingerprint, ceiling) for fingerprint, ceiling in ceilings
                        if not _holds_ceiling(session, fingerprint, ceiling)]
        for fingerprint, ceiling in new_ceilings:
            session.add(CeilingRow(device_id=_device_id(session, fingerprint), name=ceiling.name,
                                   value=ceiling.value, measured_at=ceiling.measured_at))
    return CopyCounts(len(new_runs), sum(len(run.trials) for _, run in new_runs),
                      len(new_ceilings), len(runs) - len(new_runs),
                      len(ceilings) - len(new_ceilings))


def _read(source: Database, keep: Callable[[WinnerKey], bool]) -> tuple[
        list[tuple[DeviceFingerprint, TuningResult]], list[tuple[DeviceFingerprint, CeilingRow]]]:
    statement = (select(WinnerRow, TuningRunRow, KernelRow, ProblemRow, DeviceRow)
                 .join(TuningRunRow, WinnerRow.run_id == TuningRunRow.id)
                 .join(KernelRow, WinnerRow.kernel_id == KernelRow.id)
                 .join(ProblemRow, WinnerRow.problem_id == ProblemRow.id)
                 .join(DeviceRow, WinnerRow.device_id == DeviceRow.id)
                 .order_by(WinnerRow.id))
    runs, devices = [], {}
    with source.session() as session:
        for winner, run, kernel, problem, device in session.execute(statement).all():
            fingerprint = _fingerprint(device)
            if not keep((fingerprint, kernel.name, kernel.source_hash, problem.static_key,
                         winner.bucket)):
                continue
            devices[device.id] = fingerprint
            trials = session.scalars(select(TrialRow).where(TrialRow.run_id == run.id)
                                     .order_by(TrialRow.number)).all()
            runs.append((fingerprint, TuningResult(
                kernel_name=kernel.name, source_hash=kernel.source_hash,
                static_key=problem.static_key, bucket=run.bucket, num_tokens=run.num_tokens,
                study_name=run.study_name, started_at=run.started_at,
                finished_at=run.finished_at, trials=tuple(_trial(t) for t in trials),
                winner_number=next(t.number for t in trials if t.id == winner.trial_id))))
        ceilings = [(devices[row.device_id], row) for row in session.scalars(
            select(CeilingRow).where(CeilingRow.device_id.in_(devices)).order_by(CeilingRow.id))]
        session.expunge_all()
    return runs, ceilings


def _trial(row: TrialRow) -> TrialRecord:
    return TrialRecord(number=row.number, config_json=row.config_json, status=row.status,
                       failure_reason=row.failure_reason, median_us=row.median_us,
                       iqr_us=row.iqr_us, repeats=row.repeats, gbps=row.gbps,
                       pct_roofline=row.pct_roofline, predicted_us=row.predicted_us)


def _holds_run(session: Session, fingerprint: DeviceFingerprint, run: TuningResult) -> bool:
    return session.scalar(
        select(TuningRunRow.id)
        .join(KernelRow, TuningRunRow.kernel_id == KernelRow.id)
        .join(ProblemRow, TuningRunRow.problem_id == ProblemRow.id)
        .where(KernelRow.name == run.kernel_name, KernelRow.source_hash == run.source_hash,
               ProblemRow.static_key == run.static_key, TuningRunRow.bucket == run.bucket,
               TuningRunRow.device_id == _device_id(session, fingerprint),
               TuningRunRow.study_name == run.study_name,
               TuningRunRow.started_at == run.started_at,
               TuningRunRow.finished_at == run.finished_at)
        .limit(1)) is not None


def _holds_ceiling(session: Session, fingerprint: DeviceFingerprint, row: CeilingRow) -> bool:
    return session.scalar(
        select(CeilingRow.id).where(CeilingRow.device_id == _device_id(session, fingerprint),
                                    CeilingRow.name == row.name,
                                    CeilingRow.measured_at == row.measured_at)
        .limit(1)) is not None
