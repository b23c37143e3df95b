"""The winners a warmup serves, and the device's calibrated cost model, read from the database
at a URL without SQLAlchemy where it is a SQLite file: the standard library's sqlite3 reads
each in one query. Importing SQLAlchemy and mapping the tables cost a third of a second, which
an engine's start would pay before its first call. The queries are written against schema.py's
tables, and tests hold them to what queries.winners_with_devices and
queries.calibration_to_serve read (tests/results_db/test_serving_read.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from cutetune.device.calibrated import CalibratedModel, read_stored
from cutetune.results_db.fingerprint import (
    DeviceFingerprint,
    choose_to_serve,
    latest_serving_here,
)
from cutetune.results_db.records import Winner

# queries.winners_with_devices, row for row and in its order.
_WINNERS_WITH_DEVICES = """
SELECT kernels.name, kernels.source_hash, problems.static_key, winners.bucket,
       winners.config_json, winners.median_us, winners.iqr_us, winners.gbps,
       winners.pct_roofline, winners.updated_at,
       devices.gpu_name, devices.compute_capability, devices.sm_count, devices.driver,
       devices.cuda, devices.torch, devices.cutlass_dsl
FROM winners
JOIN kernels ON winners.kernel_id = kernels.id
JOIN problems ON winners.problem_id = problems.id
JOIN devices ON winners.device_id = devices.id
ORDER BY kernels.name, kernels.source_hash, problems.static_key, winners.bucket, devices.id
"""

# queries.calibration_to_serve's rows.
_CALIBRATIONS_WITH_DEVICES = """
SELECT calibrations.params_json, calibrations.fitted_at,
       devices.gpu_name, devices.compute_capability, devices.sm_count, devices.driver,
       devices.cuda, devices.torch, devices.cutlass_dsl
FROM calibrations
JOIN devices ON calibrations.device_id = devices.id
ORDER BY calibrations.id
"""

_SQLITE = "sqlite:///"
T = TypeVar("T")


def winners_to_serve_at(url: str, here: DeviceFingerprint) -> list[Winner]:
    """queries.winners_to_serve of the database at `url` (a SQLAlchemy URL). A SQLite file is
    read with sqlite3, read-only, and one that does not exist holds no winners (nothing is
    created). Any other URL, and a file sqlite3 cannot read as a results database (no tables
    yet, locked, not a database), goes through SQLAlchemy as before: Database.open, which
    creates what is missing or raises its error."""

    def from_sqlite(connection: sqlite3.Connection) -> list[Winner]:
        return choose_to_serve(_winners(connection), here)

    def from_database(db) -> list[Winner]:
        from cutetune.results_db.queries import winners_to_serve

        return winners_to_serve(db, here)

    return _read_at(url, from_sqlite, from_database, [])


def calibration_to_serve_at(url: str, here: DeviceFingerprint) -> CalibratedModel | None:
    """queries.calibration_to_serve of the database at `url`, read as `winners_to_serve_at`
    reads (a database written before calibrations existed holds none)."""

    def from_sqlite(connection: sqlite3.Connection) -> CalibratedModel | None:
        if not connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                  "name = 'calibrations'").fetchall():
            return None  # written before calibrations were stored: none, and nothing created
        rows = connection.execute(_CALIBRATIONS_WITH_DEVICES).fetchall()
        return read_stored(latest_serving_here(
            ((DeviceFingerprint(*row[2:]), _stored_time(row[1]), row[0]) for row in rows),
            here))

    def from_database(db) -> CalibratedModel | None:
        from cutetune.results_db.queries import calibration_to_serve

        return calibration_to_serve(db, here)

    return _read_at(url, from_sqlite, from_database, None)


def _read_at(url: str, from_sqlite: Callable[[sqlite3.Connection], T],
             from_database: Callable[..., T], nothing: T) -> T:
    """`from_sqlite` of a plain SQLite file, opened read-only (`nothing` where the file does
    not exist); `from_database` of the opened Database for any other URL or a file sqlite3
    cannot read as a results database."""
    path = _sqlite_file(url)
    if path is not None:
        if not path.is_file():
            return nothing
        try:
            connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                return from_sqlite(connection)
            finally:
                connection.close()
        except sqlite3.Error:
            pass
    from cutetune.results_db.session import Database

    db = Database.open(url)
    try:
        return from_database(db)
    finally:
        db.dispose()


def _sqlite_file(url: str) -> Path | None:
    """The file of a plain `sqlite:///PATH` URL; None for any other (another backend or
    driver, a query string, a SQLite URI, an in-memory database, or a path SQLAlchemy would
    unquote: these take SQLAlchemy's reading of the URL)."""
    if not url.startswith(_SQLITE):
        return None
    database = url.removeprefix(_SQLITE)
    if not database or database == ":memory:" or database.startswith("file:") or any(
            c in database for c in "?%"):
        return None
    return Path(database).expanduser()


def _winners(connection: sqlite3.Connection) -> list[tuple[DeviceFingerprint, Winner]]:
    rows = connection.execute(_WINNERS_WITH_DEVICES).fetchall()
    return [(DeviceFingerprint(*row[10:]),
             Winner(*row[:9], _stored_time(row[9]))) for row in rows]


def _stored_time(text: str) -> datetime:
    # SQLAlchemy stores a time in SQLite as naive UTC text (schema.UTCDateTime).
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
