"""Winners as JSON or CSV, for sharing and for reading outside Python."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from typing import Any

from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import winners_with_devices
from cutetune.results_db.records import Winner
from cutetune.results_db.session import Database

FORMATS = ("json", "csv")

# Winner first, so a CSV line reads kernel, problem, bucket, config, timing, then device.
_COLUMNS = [f.name for f in fields(Winner)] + [f.name for f in fields(DeviceFingerprint)]


def export_winners(
    db: Database,
    fmt: str,
    fingerprint: DeviceFingerprint | None = None,
    kernel_name: str | None = None,
) -> str:
    """The stored winners, each with its full device fingerprint, as text in `fmt`.

    "json": a list of objects with sorted keys, each config embedded as an object.
    "csv": a header, then one line per winner, with the config as its JSON text.
    Raises ValueError for any other format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}")
    records = [
        {**asdict(winner), **asdict(device), "updated_at": winner.updated_at.isoformat()}
        for device, winner in winners_with_devices(db, fingerprint, kernel_name)
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
