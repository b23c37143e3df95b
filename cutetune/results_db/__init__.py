"""The results database: every trial, the winners, device ceilings and benchmarks.

Open one with `Database.open(url)` (any SQLite or PostgreSQL SQLAlchemy URL); write with
`record_*`, read with `winners`, `stored_runs`, `quarantined_points`, `latest_ceilings` and the
pandas frames (winners, trials, bench rows, devices with their ceilings), export with
`export_winners` and read an export back with `import_winners` (each row checked first by
`check_import`, as a freshly tuned winner is).
"""

from cutetune.results_db.export import (
    FORMATS,
    CheckedImport,
    Refusal,
    check_import,
    export_winners,
    import_winners,
    read_winners,
    store_import,
)
from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import (
    bench_frame,
    clear_quarantine,
    devices_frame,
    latest_ceilings,
    quarantined_points,
    record_bench,
    record_ceilings,
    record_quarantine,
    record_tuning_result,
    record_tuning_results,
    stored_runs,
    trials_frame,
    winners,
    winners_frame,
    winners_to_serve,
    winners_with_devices,
)
from cutetune.results_db.records import (
    BenchRecord,
    QuarantinedPoint,
    StoredRun,
    TrialRecord,
    TuningResult,
    Winner,
)
from cutetune.results_db.session import Database
from cutetune.results_db.shipped import shipped_winners, shipped_with_devices

__all__ = [
    "FORMATS",
    "BenchRecord",
    "CheckedImport",
    "Database",
    "DeviceFingerprint",
    "QuarantinedPoint",
    "Refusal",
    "StoredRun",
    "TrialRecord",
    "TuningResult",
    "Winner",
    "bench_frame",
    "check_import",
    "clear_quarantine",
    "devices_frame",
    "export_winners",
    "import_winners",
    "read_winners",
    "shipped_winners",
    "shipped_with_devices",
    "latest_ceilings",
    "quarantined_points",
    "record_bench",
    "record_ceilings",
    "record_quarantine",
    "record_tuning_result",
    "record_tuning_results",
    "store_import",
    "stored_runs",
    "trials_frame",
    "winners",
    "winners_frame",
    "winners_to_serve",
    "winners_with_devices",
]
