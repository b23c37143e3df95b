"""The results database: every trial, the winners, device ceilings and benchmarks.

Open one with `Database.open(url)` (any SQLite or PostgreSQL SQLAlchemy URL); write with
`record_*`, read with `winners`, `latest_ceilings` and the pandas frames, export with
`export_winners`.
"""

from cutetune.results_db.export import FORMATS, export_winners
from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import (
    latest_ceilings,
    record_bench,
    record_ceilings,
    record_tuning_result,
    trials_frame,
    winners,
    winners_frame,
    winners_with_devices,
)
from cutetune.results_db.records import BenchRecord, TrialRecord, TuningResult, Winner
from cutetune.results_db.session import Database

__all__ = [
    "FORMATS",
    "BenchRecord",
    "Database",
    "DeviceFingerprint",
    "TrialRecord",
    "TuningResult",
    "Winner",
    "export_winners",
    "latest_ceilings",
    "record_bench",
    "record_ceilings",
    "record_tuning_result",
    "trials_frame",
    "winners",
    "winners_frame",
    "winners_with_devices",
]
