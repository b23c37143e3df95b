"""Winners as JSON or CSV, for sharing and for reading outside Python, and read back in.

An import stores each winner as a one-trial tuning run on the device it was measured on, so it
is served only on that GPU (the fingerprint policy), and it takes a bucket only where the
stored winner is slower (the rule every run follows).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Mapping
from dataclasses import asdict, fields
from datetime import datetime
from typing import Any

from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import record_tuning_result, winners_with_devices
from cutetune.results_db.records import TrialRecord, TuningResult, Winner
from cutetune.results_db.session import Database

FORMATS = ("json", "csv")

# Winner first, so a CSV line reads kernel, problem, bucket, config, timing, then device. What
# a winner says about the environment asking for it (measured_elsewhere) is not stored data.
_WINNER_COLUMNS = [f.name for f in fields(Winner) if f.name != "measured_elsewhere"]
_DEVICE_COLUMNS = [f.name for f in fields(DeviceFingerprint)]
_COLUMNS = _WINNER_COLUMNS + _DEVICE_COLUMNS


def export_winners(
    db: Database,
    fmt: str,
    fingerprint: DeviceFingerprint | None = None,
    kernel_name: str | None = None,
    problems: Collection[tuple[str, str]] | None = None,
    source_hashes: Mapping[str, str] | None = None,
) -> str:
    """The stored winners, each with its full device fingerprint, as text in `fmt`; only those
    of `problems` ((kernel name, static key) pairs, e.g. a model's) where it is given, and
    only those measured with the code whose hash `source_hashes` gives per kernel name (e.g.
    the installed kernels') where that is given.

    "json": a list of objects with sorted keys, each config embedded as an object.
    "csv": a header, then one line per winner, with the config as its JSON text.
    Raises ValueError for any other format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}")
    records = [
        {**{name: getattr(winner, name) for name in _WINNER_COLUMNS}, **asdict(device),
         "updated_at": winner.updated_at.isoformat()}
        for device, winner in winners_with_devices(db, fingerprint, kernel_name)
        if (problems is None or (winner.kernel_name, winner.static_key) in problems)
        and (source_hashes is None
             or source_hashes.get(winner.kernel_name) == winner.source_hash)
    ]
    if fmt == "json":
        return _to_json(records)
    return _to_csv(records)


def _to_json(records: list[dict[str, Any]]) -> str:
    # The config goes in as an object, so readers do not parse JSON inside JSON.
    for record in records:
        record["config"] = json.loads(record.pop("config_json"))
    return json.dumps(records, indent=2, sort_keys=True) + "\n"


def _to_csv(records: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    # The header comes from the fields, not the rows, so an empty export still names its columns.
    writer = csv.DictWriter(out, fieldnames=_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def read_winners(text: str, fmt: str) -> list[tuple[DeviceFingerprint, Winner]]:
    """The winners of an export with the devices they were measured on, every record checked;
    ValueError names the first bad one."""
    return [(device, _winner_of(result))
            for device, result in _read_runs(text, fmt)]


def _winner_of(result: TuningResult) -> Winner:
    (trial,) = result.trials
    return Winner(result.kernel_name, result.source_hash, result.static_key, result.bucket,
                  trial.config_json, trial.median_us, trial.iqr_us, trial.gbps,
                  trial.pct_roofline, result.finished_at)


def _read_runs(text: str, fmt: str) -> list[tuple[DeviceFingerprint, TuningResult]]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown import format {fmt!r}: expected one of {', '.join(FORMATS)}")
    records = _from_json(text) if fmt == "json" else _from_csv(text)
    return [_as_run(number, record) for number, record in enumerate(records, 1)]


def import_winners(db: Database, text: str, fmt: str) -> int:
    """Store the winners of an export (`fmt` "json" or "csv"); the number stored. Every record
    is read and checked before anything is written; ValueError names the first bad one."""
    results = _read_runs(text, fmt)
    for fingerprint, result in results:
        record_tuning_result(db, fingerprint, result)
    return len(results)


def _from_json(text: str) -> list[dict[str, Any]]:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON export: {err}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("not a JSON export: expected a list of winner objects")
    for record in records:
        if "config" in record:
            record["config_json"] = json.dumps(record.pop("config"), sort_keys=True)
    return records


def _from_csv(text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"not a CSV export: missing the columns {', '.join(missing)}")
    return list(reader)


def _as_run(number: int, record: dict[str, Any]) -> tuple[DeviceFingerprint, TuningResult]:
    """A record as the one-trial run it is stored as, on the device it names."""
    missing = [c for c in _COLUMNS if c not in record]
    if missing:
        raise ValueError(f"winner {number}: missing {', '.join(missing)}")
    try:
        device = {name: record[name] for name in _DEVICE_COLUMNS}
        fingerprint = DeviceFingerprint(**{**device, "sm_count": int(device["sm_count"])})
        bucket = int(record["bucket"])
        measured_at = datetime.fromisoformat(str(record["updated_at"]))
        config_json = json.dumps(json.loads(record["config_json"]), sort_keys=True)
        trial = TrialRecord(0, config_json, "ok", None, float(record["median_us"]),
                            _number_or_none(record["iqr_us"]), None,
                            _number_or_none(record["gbps"]),
                            _number_or_none(record["pct_roofline"]), None)
        result = TuningResult(record["kernel_name"], record["source_hash"],
                              record["static_key"], bucket, bucket,
                              f"imported {record['kernel_name']} {bucket}", measured_at,
                              measured_at, (trial,), 0)
    except (TypeError, ValueError) as err:
        raise ValueError(f"winner {number} ({record.get('kernel_name')}, bucket "
                         f"{record.get('bucket')}): {err}") from None
    return fingerprint, result


def _number_or_none(value: Any) -> float | None:
    return None if value in (None, "") else float(value)
