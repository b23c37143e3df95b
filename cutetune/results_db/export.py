"""Winners as JSON or CSV, for sharing and for reading outside Python, and read back in.

An import stores each winner as a one-trial tuning run on the device it was measured on, so it
is served only on that GPU (the fingerprint policy), and it takes a bucket only where the
stored winner is slower (the rule every run follows). Every row is first checked as a freshly
tuned winner would be (check_import): what a file holds came from another cutetune, another
machine or an editor, and a row the kernels cannot use would otherwise fail later, in a
warmup or a compile far from its cause.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cutetune.kernels.stored import UnusablePoint, stored_point
from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.records import TrialRecord, TuningResult, Winner
from cutetune.spaces.space import config_to_json

if TYPE_CHECKING:
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
    # The database's modules (SQLAlchemy) only where one is read or written: a warmup reads
    # the shipped winners' files (read_winners) without them.
    from cutetune.results_db.queries import winners_with_devices

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
    """The winners of an export with the devices they were measured on, every record's fields
    checked (not their points: see check_import); ValueError names the first bad one."""
    records = _records(text, fmt)
    pairs = []
    for number, record in enumerate(records, 1):
        try:
            device, result = _as_run(record)
        except _Refused as refused:
            raise ValueError(str(Refusal(number, _column(refused.field, fmt),
                                         refused.reason))) from None
        pairs.append((device, _winner_of(result)))
    return pairs


def _winner_of(result: TuningResult) -> Winner:
    (trial,) = result.trials
    return Winner(result.kernel_name, result.source_hash, result.static_key, result.bucket,
                  trial.config_json, trial.median_us, trial.iqr_us, trial.gbps,
                  trial.pct_roofline, result.finished_at)


@dataclass(frozen=True)
class Refusal:
    """A row of an import file that is not stored: its number (from 1), the column at fault
    and why."""

    row: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.field}: {self.reason}"


@dataclass(frozen=True)
class CheckedImport:
    """An import file's rows, checked: the runs to store, one per winner key (kernel, source
    hash, problem, bucket, device); how many valid rows repeated the key of an earlier one
    (merged into it by the winner rule: the faster config, or the later measurement of the
    same config); and the rows refused."""

    rows: int
    runs: tuple[tuple[DeviceFingerprint, TuningResult], ...]
    duplicates: int
    refused: tuple[Refusal, ...]


def check_import(text: str, fmt: str, device_spec: Callable[[str], Any]) -> CheckedImport:
    """Read and check every row of an export (`fmt` "json" or "csv") as a freshly tuned winner
    is checked: every column present; a registered kernel and a source hash; a bucket of the
    bucketing policy; a static key the kernel's problem type accepts; a config of the kernel's
    space, valid for that problem at that bucket on the row's GPU; a finite positive median
    and finite non-negative iqr, GB/s and percent of roofline where given; a measurement time
    with its time zone; every device field given (sm_count a positive integer) and a GPU
    cutetune has a DeviceSpec of. `device_spec` gives the DeviceSpec of a GPU name, ValueError
    for one it has none of (cutetune.device.specs.device_spec_for, which the caller passes).
    Writes nothing; raises ValueError only for text that is no export at all (not JSON, the
    CSV columns missing)."""
    records = _records(text, fmt)
    kept: dict[tuple, tuple[DeviceFingerprint, TuningResult]] = {}
    duplicates, refused = 0, []
    for number, record in enumerate(records, 1):
        try:
            device, result = _checked_run(record, device_spec)
        except _Refused as why:
            refused.append(Refusal(number, _column(why.field, fmt), why.reason))
            continue
        key = (result.kernel_name, result.source_hash, result.static_key, result.bucket, device)
        held = kept.get(key)
        if held is not None:
            duplicates += 1
            if not _replaces(result, held[1]):
                continue
        kept[key] = (device, result)
    return CheckedImport(len(records), tuple(kept.values()), duplicates, tuple(refused))


def store_import(db: Database, checked: CheckedImport) -> int:
    """Store the runs of a checked import, all in one transaction; the number stored."""
    from cutetune.results_db.queries import record_tuning_results

    record_tuning_results(db, checked.runs)
    return len(checked.runs)


def import_winners(db: Database, text: str, fmt: str, device_spec: Callable[[str], Any],
                   skip_invalid: bool = False) -> CheckedImport:
    """Check an export (check_import) and store its winners in one transaction. With any row
    refused nothing is written and ValueError names the first, unless `skip_invalid`: then
    the valid rows are stored, and the refused ones are in the returned CheckedImport."""
    checked = check_import(text, fmt, device_spec)
    if checked.refused and not skip_invalid:
        raise ValueError(f"{len(checked.refused)} of {checked.rows} rows refused, the first "
                         f"{checked.refused[0]}; nothing imported")
    store_import(db, checked)
    return checked


def _replaces(new: TuningResult, held: TuningResult) -> bool:
    """The winner rule (queries.record_tuning_result) between two rows of one key."""
    (new_trial,), (held_trial,) = new.trials, held.trials
    if new_trial.config_json == held_trial.config_json:
        return new.finished_at >= held.finished_at
    return new_trial.median_us < held_trial.median_us


def _records(text: str, fmt: str) -> list[dict[str, Any]]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown import format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return _from_json(text) if fmt == "json" else _from_csv(text)


def _column(field: str, fmt: str) -> str:
    """A stored field as the file's column: a JSON export holds the config as an object
    under "config"."""
    return "config" if fmt == "json" and field == "config_json" else field


def _from_json(text: str) -> list[dict[str, Any]]:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON export: {err}") from None
    except RecursionError:
        raise ValueError("not a JSON export: nested too deeply") from None
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
    try:
        return list(reader)
    except csv.Error as err:
        raise ValueError(f"not a CSV export: {err}") from None


class _Refused(Exception):
    """A row's field that cannot be stored, and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.field = field
        self.reason = reason


def _checked_run(record: dict[str, Any], device_spec: Callable[[str], Any]
                 ) -> tuple[DeviceFingerprint, TuningResult]:
    """A record as the run it is stored as (`_as_run`), its point checked as today's kernels
    read it and written as a tuning of that point would write it (its canonical static key
    and config)."""
    device, result = _as_run(record)
    try:
        spec = device_spec(device.gpu_name)
    except ValueError as err:
        raise _Refused("gpu_name", str(err)) from None
    (trial,) = result.trials
    try:
        point = stored_point(result.kernel_name, result.static_key, result.bucket,
                             trial.config_json, spec)
    except UnusablePoint as why:
        raise _Refused(why.field, why.reason) from None
    trial = replace(trial, config_json=config_to_json(point.config))
    return device, replace(result, static_key=point.problem.static_key(), trials=(trial,))


def _as_run(record: dict[str, Any]) -> tuple[DeviceFingerprint, TuningResult]:
    """A record as the one-trial run it is stored as, on the device it names; _Refused names
    the first field that is missing or not of its kind."""
    for column in _COLUMNS:
        if column not in record:
            raise _Refused(column, "missing")
    kernel_name = _text(record, "kernel_name")
    source_hash = _text(record, "source_hash")
    static_key = _text(record, "static_key")
    bucket = _integer(record, "bucket")
    try:
        config = json.loads(record["config_json"])
    except (TypeError, ValueError, RecursionError):
        config = None
    if not isinstance(config, dict):
        raise _Refused("config_json", f"{record['config_json']!r} is not a JSON object")
    trial_fields = {"median_us": _number(record, "median_us", positive=True),
                    **{name: _number(record, name, optional=True)
                       for name in ("iqr_us", "gbps", "pct_roofline")}}
    measured_at = _time(record, "updated_at")
    device = DeviceFingerprint(**{
        name: (_integer(record, name, positive=True) if name == "sm_count"
               else _text(record, name)) for name in _DEVICE_COLUMNS})
    trial = TrialRecord(0, json.dumps(config, sort_keys=True), "ok", None,
                        trial_fields["median_us"], trial_fields["iqr_us"], None,
                        trial_fields["gbps"], trial_fields["pct_roofline"], None)
    return device, TuningResult(kernel_name, source_hash, static_key, bucket, bucket,
                                f"imported {kernel_name} {bucket}", measured_at, measured_at,
                                (trial,), 0)


def _text(record: dict[str, Any], name: str) -> str:
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise _Refused(name, f"must be a non-empty string, got {value!r}")
    return value


def _integer(record: dict[str, Any], name: str, positive: bool = False) -> int:
    value = record[name]
    # A CSV holds text; JSON an integer (not true, not 16.0).
    try:
        number = int(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if type(number) is not int or (positive and number < 1):
        raise _Refused(name, f"must be a{' positive' if positive else 'n'} integer, "
                             f"got {value!r}")
    return number


def _number(record: dict[str, Any], name: str, positive: bool = False,
            optional: bool = False) -> float | None:
    value = record[name]
    if optional and value in (None, ""):
        return None
    try:
        number = float(value) if type(value) in (int, float, str) else None
    except ValueError:
        number = None
    if number is None or not math.isfinite(number) or number < 0 or (positive and number == 0):
        kind = "a finite positive number" if positive else "a finite number >= 0"
        raise _Refused(name, f"must be {kind}{' or empty' if optional else ''}, got {value!r}")
    return number


def _time(record: dict[str, Any], name: str) -> datetime:
    value = record[name]
    try:
        time = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        time = None
    if time is None or time.tzinfo is None:
        raise _Refused(name, f"must be an ISO 8601 time with its time zone, got {value!r}")
    return time
