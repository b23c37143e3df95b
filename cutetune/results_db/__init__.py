"""The results database: every trial, the winners, device ceilings and benchmarks.

Open one with `Database.open(url)` (any SQLite or PostgreSQL SQLAlchemy URL); write with
`record_*`, read with `winners`, `stored_runs`, `quarantined_points`, `latest_ceilings` and the
pandas frames (winners, trials, bench rows, devices with their ceilings), export with
`export_winners` and read an export back with `import_winners` (each row checked first by
`check_import`, as a freshly tuned winner is); copy winners with their runs, trials and
ceilings between databases with `copy_results`. A warmup reads the winners it serves with
`winners_to_serve_at(url, fingerprint)`, which reads a SQLite file without SQLAlchemy.
"""

import importlib

# Each public name and the module defining it, imported when the name is first asked for: a
# warmup needs the fingerprint, the shipped winners and `winners_to_serve_at`, none of which
# imports SQLAlchemy, whose import (a third of a second) the rest would cost it.
_DEFINED_IN = {
    **dict.fromkeys(("FORMATS", "CheckedImport", "Refusal", "check_import", "export_winners",
                     "import_winners", "read_winners", "store_import"), "export"),
    **dict.fromkeys(("BucketKey", "claim_bucket", "release_claim", "renew_claim"), "claims"),
    **dict.fromkeys(("CopyCounts", "copy_results"), "copy_db"),
    "DeviceFingerprint": "fingerprint",
    **dict.fromkeys(("bench_frame", "calibration_to_serve", "calibrations_with_devices",
                     "clear_quarantine",
                     "devices_frame", "latest_ceilings", "quarantined_points", "record_bench",
                     "record_calibration", "record_ceilings",
                     "record_quarantine", "record_tuning_result", "record_tuning_results",
                     "stored_devices", "stored_runs", "trials_frame", "winners", "winners_frame",
                     "winners_to_serve", "winners_with_devices"), "queries"),
    **dict.fromkeys(("BenchRecord", "QuarantinedPoint", "StoredRun", "TrialRecord",
                     "TuningResult", "Winner"), "records"),
    **dict.fromkeys(("calibration_to_serve_at", "winners_to_serve_at"), "serving_read"),
    "Database": "session",
    **dict.fromkeys(("shipped_winners", "shipped_with_devices"), "shipped"),
}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str):
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'cutetune.results_db' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"cutetune.results_db.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
