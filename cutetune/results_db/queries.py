"""Writing tuning results, ceilings and benchmarks, and reading them back.

Each write is one transaction: a failure part way leaves the database as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Select, and_, case, delete, func, inspect, or_, select
from sqlalchemy.orm import Session

from cutetune.device.calibrated import CalibratedModel, read_stored
from cutetune.results_db.dialects import insert_for
from cutetune.results_db.fingerprint import (
    DeviceFingerprint,
    choose_to_serve,
    latest_serving_here,
)
from cutetune.results_db.records import (
    BenchRecord,
    QuarantinedPoint,
    StoredRun,
    TuningResult,
    Winner,
)
from cutetune.results_db.schema import (
    BenchRow,
    CalibrationRow,
    CeilingRow,
    DeviceRow,
    KernelRow,
    ProblemRow,
    QuarantineRow,
    TrialRow,
    TuningRunRow,
    WinnerRow,
)
from cutetune.results_db.session import Database

if TYPE_CHECKING:
    import pandas as pd

# WinnerRow's unique constraint: one winner per kernel source, problem, device and bucket.
_WINNER_KEY = ("kernel_id", "problem_id", "device_id", "bucket")
_QUARANTINE_KEY = ("kernel_id", "problem_id", "device_id", "config_json")


def record_tuning_result(
    db: Database, fingerprint: DeviceFingerprint, result: TuningResult
) -> None:
    """Store a tuning run with all its trials and, if it found one, its winner.

    The stored winner for (kernel, problem, device, bucket) is replaced by another config when
    that is faster, and by the same config measured again no earlier: the newer measurement
    of one config is the one to trust, whichever way it moved (an import of an older one
    changes nothing). A winner's time (`updated_at`) is its run's `finished_at`, when it was
    measured, so an exported and imported winner keeps it.
    """
    record_tuning_results(db, [(fingerprint, result)])


def record_tuning_results(
    db: Database, runs: Iterable[tuple[DeviceFingerprint, TuningResult]]
) -> None:
    """`record_tuning_result` of several runs, each on its device, in one transaction: all are
    stored or none (an import)."""
    with db.session() as session:
        for fingerprint, result in runs:
            _record_run(session, fingerprint, result)


def _record_run(session: Session, fingerprint: DeviceFingerprint, result: TuningResult) -> None:
    run = TuningRunRow(
        kernel_id=_get_or_create_id(
            session, KernelRow, name=result.kernel_name, source_hash=result.source_hash
        ),
        problem_id=_get_or_create_id(
            session, ProblemRow, kernel_name=result.kernel_name, static_key=result.static_key
        ),
        device_id=_device_id(session, fingerprint),
        bucket=result.bucket,
        num_tokens=result.num_tokens,
        study_name=result.study_name,
        started_at=result.started_at,
        finished_at=result.finished_at,
        trials=[TrialRow(**asdict(trial)) for trial in result.trials],
    )
    session.add(run)
    session.flush()
    if result.winner_number is not None:
        trial = next(t for t in run.trials if t.number == result.winner_number)
        _upsert_winner(session, run, trial)


def stored_runs(db: Database, fingerprint: DeviceFingerprint, kernel_name: str,
                source_hash: str, static_key: str) -> dict[int, StoredRun]:
    """By bucket, the latest finished tuning run of one kernel source and problem on one
    device, with the bucket's winner."""
    failed = func.sum(case((TrialRow.status == "failed", 1), else_=0))
    statement = (
        select(TuningRunRow.bucket, func.count(TrialRow.id), failed)
        .join(KernelRow, TuningRunRow.kernel_id == KernelRow.id)
        .join(ProblemRow, TuningRunRow.problem_id == ProblemRow.id)
        .join(DeviceRow, TuningRunRow.device_id == DeviceRow.id)
        .outerjoin(TrialRow, TrialRow.run_id == TuningRunRow.id)
        .where(*_filters(fingerprint, kernel_name, source_hash, static_key))
        .group_by(TuningRunRow.id, TuningRunRow.bucket)
        .order_by(TuningRunRow.id)
    )
    won = {w.bucket: w for w in winners(db, fingerprint, kernel_name)
           if (w.source_hash, w.static_key) == (source_hash, static_key)}
    with db.session() as session:
        rows = session.execute(statement).all()
    # Oldest first, so the latest run of a bucket is the one kept.
    return {bucket: StoredRun(bucket, trials, failed or 0, won.get(bucket))
            for bucket, trials, failed in rows}


def record_quarantine(db: Database, fingerprint: DeviceFingerprint,
                      point: QuarantinedPoint) -> None:
    """Keep a point out of tuning (or update its reason if it is kept out already)."""
    with db.session() as session:
        values = {
            "kernel_id": _get_or_create_id(session, KernelRow, name=point.kernel_name,
                                           source_hash=point.source_hash),
            "problem_id": _get_or_create_id(session, ProblemRow, kernel_name=point.kernel_name,
                                            static_key=point.static_key),
            "device_id": _device_id(session, fingerprint),
            "config_json": point.config_json,
            "bucket": point.bucket,
            "reason": point.reason,
            "recorded_at": point.recorded_at,
        }
        insert = insert_for(session, QuarantineRow).values(**values)
        session.execute(insert.on_conflict_do_update(
            index_elements=list(_QUARANTINE_KEY),
            set_={name: insert.excluded[name] for name in ("bucket", "reason", "recorded_at")}))


def quarantined_points(
    db: Database, fingerprint: DeviceFingerprint | None = None, kernel_name: str | None = None,
    source_hash: str | None = None, static_key: str | None = None,
) -> list[tuple[DeviceFingerprint, QuarantinedPoint]]:
    """Quarantined points with their device, optionally of one device, kernel, kernel source
    and problem; ordered by kernel, problem and time."""
    statement = _quarantine_where(
        select(QuarantineRow, KernelRow, ProblemRow.static_key, DeviceRow),
        fingerprint, kernel_name, source_hash, static_key,
    ).order_by(KernelRow.name, ProblemRow.static_key, QuarantineRow.recorded_at)
    with db.session() as session:
        return [(_fingerprint(device),
                 QuarantinedPoint(kernel.name, kernel.source_hash, key, row.config_json,
                                  row.bucket, row.reason, row.recorded_at))
                for row, kernel, key, device in session.execute(statement)]


def clear_quarantine(db: Database, fingerprint: DeviceFingerprint, kernel_name: str,
                     source_hash: str, static_key: str) -> int:
    """Let the quarantined points of one kernel source, problem and device be tried again;
    returns how many there were."""
    ids = _quarantine_where(select(QuarantineRow.id), fingerprint, kernel_name, source_hash,
                            static_key)
    with db.session() as session:
        return session.execute(delete(QuarantineRow).where(QuarantineRow.id.in_(ids))).rowcount


def winners_with_devices(
    db: Database, fingerprint: DeviceFingerprint | None = None, kernel_name: str | None = None
) -> list[tuple[DeviceFingerprint, Winner]]:
    """Stored winners with the device each was measured on; all devices when `fingerprint` is
    None. Ordered by kernel, source hash, problem, bucket and device."""
    statement = (
        select(WinnerRow, KernelRow, ProblemRow.static_key, DeviceRow)
        .join(KernelRow, WinnerRow.kernel_id == KernelRow.id)
        .join(ProblemRow, WinnerRow.problem_id == ProblemRow.id)
        .join(DeviceRow, WinnerRow.device_id == DeviceRow.id)
        .order_by(
            KernelRow.name,
            KernelRow.source_hash,
            ProblemRow.static_key,
            WinnerRow.bucket,
            DeviceRow.id,
        )
    )
    if fingerprint is not None:
        statement = statement.where(*_is_device(fingerprint))
    if kernel_name is not None:
        statement = statement.where(KernelRow.name == kernel_name)
    with db.session() as session:
        return [
            (_fingerprint(device), _winner(winner, kernel, static_key))
            for winner, kernel, static_key, device in session.execute(statement)
        ]


def winners_to_serve(db: Database, here: DeviceFingerprint,
                     kernel_name: str | None = None) -> list[Winner]:
    """The winners the fingerprint policy lets this device serve (fingerprint.serves_here), one
    per kernel source, problem and bucket: one measured in this very environment where there
    is one, else the most recent; each says how its environment differed
    (Winner.measured_elsewhere)."""
    return choose_to_serve(winners_with_devices(db, None, kernel_name), here)


def winners(
    db: Database, fingerprint: DeviceFingerprint | None = None, kernel_name: str | None = None
) -> list[Winner]:
    """Stored winners for one device (all devices when `fingerprint` is None), optionally of one
    kernel. Ordered by kernel, source hash, problem, bucket and device."""
    return [winner for _, winner in winners_with_devices(db, fingerprint, kernel_name)]


def record_ceilings(
    db: Database, fingerprint: DeviceFingerprint, values: Mapping[str, float]
) -> None:
    """Store ceilings measured on a device now, e.g. {"copy_gbps": 4200.0}."""
    measured_at = datetime.now(UTC)
    with db.session() as session:
        device_id = _device_id(session, fingerprint)
        session.add_all(
            CeilingRow(device_id=device_id, name=name, value=value, measured_at=measured_at)
            for name, value in values.items()
        )


def latest_ceilings(db: Database, fingerprint: DeviceFingerprint) -> dict[str, float]:
    """The latest measured value of each ceiling of a device; empty if none was measured."""
    statement = (
        select(CeilingRow.name, CeilingRow.value)
        .join(DeviceRow, CeilingRow.device_id == DeviceRow.id)
        .where(*_is_device(fingerprint))
        .order_by(CeilingRow.measured_at, CeilingRow.id)
    )
    with db.session() as session:
        # Oldest first, so a later value of a name overwrites an earlier one.
        return dict(session.execute(statement).all())


def record_calibration(db: Database, fingerprint: DeviceFingerprint,
                       model: CalibratedModel) -> None:
    """Store the cost model fitted to a device's trials now; the latest one is read."""
    with db.session() as session:
        session.add(CalibrationRow(device_id=_device_id(session, fingerprint), form=model.form,
                                   params_json=model.to_json(), trials=model.trials,
                                   fitted_at=datetime.now(UTC)))


def calibration_to_serve(db: Database, here: DeviceFingerprint) -> CalibratedModel | None:
    """The calibrated model `here` may use (fingerprint.latest_serving_here: fitted to this
    device's trials, or to those of another environment of the same GPU and CuTeDSL); None
    where none is stored, or only of a form this cutetune does not read."""
    return read_stored(latest_serving_here(calibrations_with_devices(db), here))


def calibrations_with_devices(db: Database) -> list[tuple[DeviceFingerprint, datetime, str]]:
    """Every stored calibration as (device, fitted at, its JSON), oldest first; none where the
    database predates calibrations (opened read-only, it was not given the table)."""
    if not inspect(db.engine).has_table(CalibrationRow.__tablename__):
        return []
    statement = (select(CalibrationRow.params_json, CalibrationRow.fitted_at, DeviceRow)
                 .join(DeviceRow, CalibrationRow.device_id == DeviceRow.id)
                 .order_by(CalibrationRow.id))
    with db.session() as session:
        return [(_fingerprint(device), fitted_at, params)
                for params, fitted_at, device in session.execute(statement)]


def record_bench(db: Database, fingerprint: DeviceFingerprint, rows: Sequence[BenchRecord]) -> None:
    """Store benchmark results measured on a device now, all or none."""
    measured_at = datetime.now(UTC)
    with db.session() as session:
        device_id = _device_id(session, fingerprint)
        session.add_all(
            BenchRow(device_id=device_id, measured_at=measured_at, **asdict(row)) for row in rows
        )


def trials_frame(db: Database, kernel_name: str | None = None,
                 fingerprint: DeviceFingerprint | None = None) -> pd.DataFrame:
    """Every stored trial (of one device when `fingerprint` is given), one row each, with its
    kernel, problem, bucket and GPU name."""
    statement = (
        select(
            KernelRow.name.label("kernel_name"),
            KernelRow.source_hash,
            ProblemRow.static_key,
            TuningRunRow.bucket,
            TuningRunRow.num_tokens,
            DeviceRow.gpu_name,
            TuningRunRow.study_name,
            TrialRow.run_id,
            TrialRow.number,
            TrialRow.config_json,
            TrialRow.status,
            TrialRow.failure_reason,
            TrialRow.median_us,
            TrialRow.iqr_us,
            TrialRow.repeats,
            TrialRow.gbps,
            TrialRow.pct_roofline,
            TrialRow.predicted_us,
        )
        .join(TuningRunRow, TrialRow.run_id == TuningRunRow.id)
        .join(KernelRow, TuningRunRow.kernel_id == KernelRow.id)
        .join(ProblemRow, TuningRunRow.problem_id == ProblemRow.id)
        .join(DeviceRow, TuningRunRow.device_id == DeviceRow.id)
        .order_by(TrialRow.run_id, TrialRow.number)
    )
    if kernel_name is not None:
        statement = statement.where(KernelRow.name == kernel_name)
    if fingerprint is not None:
        statement = statement.where(*_is_device(fingerprint))
    return _frame(db, statement)


def bench_frame(db: Database, fingerprint: DeviceFingerprint | None = None) -> pd.DataFrame:
    """Every stored benchmark row (of one device when `fingerprint` is given), oldest first,
    with the GPU name of its device."""
    statement = (
        select(BenchRow.kernel_name, BenchRow.static_key, BenchRow.num_tokens,
               BenchRow.implementation, BenchRow.median_us, BenchRow.gbps, BenchRow.pct_of_copy,
               BenchRow.measured_at, DeviceRow.gpu_name)
        .join(DeviceRow, BenchRow.device_id == DeviceRow.id)
        .order_by(BenchRow.measured_at, BenchRow.id)
    )
    if fingerprint is not None:
        statement = statement.where(*_is_device(fingerprint))
    return _frame(db, statement)


def stored_devices(db: Database) -> list[DeviceFingerprint]:
    """Every device fingerprint stored, in the order they were first stored."""
    with db.session() as session:
        devices = session.scalars(select(DeviceRow).order_by(DeviceRow.id)).all()
        return [_fingerprint(device) for device in devices]


def devices_frame(db: Database) -> pd.DataFrame:
    """Every device fingerprint, one row each, with the latest value of each ceiling measured
    on it as a column of that name (missing where it was never measured)."""
    fingerprints = stored_devices(db)
    rows = [{**asdict(fingerprint), **latest_ceilings(db, fingerprint)}
            for fingerprint in fingerprints]
    import pandas as pd

    return pd.DataFrame(rows, columns=list(
        dict.fromkeys([f.name for f in fields(DeviceFingerprint)]
                      + [name for row in rows for name in row])))


def _frame(db: Database, statement: Select) -> pd.DataFrame:
    with db.session() as session:
        rows = session.execute(statement).all()
    import pandas as pd  # here, not at import: an engine's warmup reads winners, no frames

    return pd.DataFrame(rows, columns=list(statement.selected_columns.keys()))


def winners_frame(
    db: Database, fingerprint: DeviceFingerprint | None = None, kernel_name: str | None = None
) -> pd.DataFrame:
    """`winners()` as a frame, one row per winner, with the GPU name of its device."""
    columns = [field.name for field in fields(Winner)] + ["gpu_name"]
    rows = [
        {**asdict(winner), "gpu_name": device.gpu_name}
        for device, winner in winners_with_devices(db, fingerprint, kernel_name)
    ]
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


def _get_or_create_id(session: Session, entity: type, **key: Any) -> int:
    # Insert first and ignore a conflict: another process may be creating the same row now.
    session.execute(insert_for(session, entity).values(**key).on_conflict_do_nothing())
    return session.scalars(select(entity.id).filter_by(**key)).one()


def _device_id(session: Session, fingerprint: DeviceFingerprint) -> int:
    return _get_or_create_id(session, DeviceRow, **asdict(fingerprint))


def _upsert_winner(session: Session, run: TuningRunRow, trial: TrialRow) -> None:
    values = {
        "kernel_id": run.kernel_id,
        "problem_id": run.problem_id,
        "device_id": run.device_id,
        "bucket": run.bucket,
        "config_json": trial.config_json,
        "median_us": trial.median_us,
        "iqr_us": trial.iqr_us,
        "gbps": trial.gbps,
        "pct_roofline": trial.pct_roofline,
        "trial_id": trial.id,
        "run_id": run.id,
        # When it was measured, not when it was written: an import keeps the export's time.
        "updated_at": run.finished_at,
    }
    insert = insert_for(session, WinnerRow).values(**values)
    new = insert.excluded
    session.execute(
        insert.on_conflict_do_update(
            index_elements=list(_WINNER_KEY),
            set_={name: new[name] for name in values if name not in _WINNER_KEY},
            where=or_(
                and_(WinnerRow.config_json != new.config_json,
                     WinnerRow.median_us > new.median_us),
                and_(WinnerRow.config_json == new.config_json,
                     WinnerRow.updated_at <= new.updated_at),
            ),
        )
    )


def _quarantine_where(statement: Select, fingerprint: DeviceFingerprint | None,
                      kernel_name: str | None, source_hash: str | None,
                      static_key: str | None) -> Select:
    """`statement` over quarantined points joined to their kernel, problem and device, and
    filtered by those given."""
    return (statement
            .join(KernelRow, QuarantineRow.kernel_id == KernelRow.id)
            .join(ProblemRow, QuarantineRow.problem_id == ProblemRow.id)
            .join(DeviceRow, QuarantineRow.device_id == DeviceRow.id)
            .where(*_filters(fingerprint, kernel_name, source_hash, static_key)))


def _filters(fingerprint: DeviceFingerprint | None, kernel_name: str | None,
             source_hash: str | None, static_key: str | None) -> list[ColumnElement[bool]]:
    conditions = [] if fingerprint is None else _is_device(fingerprint)
    for column, value in ((KernelRow.name, kernel_name), (KernelRow.source_hash, source_hash),
                          (ProblemRow.static_key, static_key)):
        if value is not None:
            conditions.append(column == value)
    return conditions


def _is_device(fingerprint: DeviceFingerprint) -> list[ColumnElement[bool]]:
    return [getattr(DeviceRow, name) == value for name, value in asdict(fingerprint).items()]


def _fingerprint(device: DeviceRow) -> DeviceFingerprint:
    return DeviceFingerprint(**{f.name: getattr(device, f.name) for f in fields(DeviceFingerprint)})


def _winner(row: WinnerRow, kernel: KernelRow, static_key: str) -> Winner:
    return Winner(
        kernel_name=kernel.name,
        source_hash=kernel.source_hash,
        static_key=static_key,
        bucket=row.bucket,
        config_json=row.config_json,
        median_us=row.median_us,
        iqr_us=row.iqr_us,
        gbps=row.gbps,
        pct_roofline=row.pct_roofline,
        updated_at=row.updated_at,
    )
