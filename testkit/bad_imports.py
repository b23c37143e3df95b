"""Rows of `cutetune export` files for the tests of `cutetune import` and of what reads stored
winners: valid rows (qk_norm on Qwen3-8B, from the hand-made winners of stored_winners.py), a
table of invalid ones, each with the column its refusal names and a part of its reason, and
stored rows that today's qk_norm cannot use, written past the import's checks as an older
cutetune or another tool could have."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cutetune.kernels import qk_norm as qk
from cutetune.results_db import DeviceFingerprint, TrialRecord, TuningResult, Winner
from cutetune.spaces.models import load_model
from testkit.fake_qk_runner import FINGERPRINT
from testkit.stored_winners import winner

PROBLEM = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
SMALL = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
LARGE = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)
VALID = ((8, SMALL), (4096, LARGE))
MEASURED_AT = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def valid_winners() -> list[Winner]:
    """The winners of VALID, measured a minute apart."""
    return [dataclasses.replace(winner(qk.KERNEL, PROBLEM, bucket, config),
                                updated_at=MEASURED_AT + timedelta(minutes=number))
            for number, (bucket, config) in enumerate(VALID)]


def as_record(measured: Winner, device: DeviceFingerprint = FINGERPRINT) -> dict[str, Any]:
    """A winner as a JSON export's object holds it."""
    fields = {f.name: getattr(measured, f.name) for f in dataclasses.fields(Winner)
              if f.name not in ("measured_elsewhere", "config_json")}
    return {**fields, "config": json.loads(measured.config_json),
            **dataclasses.asdict(device), "updated_at": measured.updated_at.isoformat()}


def valid_records() -> list[dict[str, Any]]:
    return [as_record(w) for w in valid_winners()]


def export_text(records: list[dict[str, Any]], fmt: str) -> str:
    """Records written as `cutetune export` writes `fmt` (a CSV holds each config as JSON
    text, a missing value as an empty field); a record may lack a column."""
    if fmt == "json":
        return json.dumps(records, indent=2)
    columns = list(dict.fromkeys(name for record in records for name in record))
    columns = ["config_json" if name == "config" else name for name in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for record in records:
        row = {("config_json" if k == "config" else k): v for k, v in record.items()}
        if "config" in record:
            row["config_json"] = json.dumps(record["config"])
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue()


def _set(**values: Any) -> Callable[[dict], None]:
    return lambda record: record.update(values)


def _knobs(**values: Any) -> Callable[[dict], None]:
    return lambda record: record["config"].update(values)


def _drop_knob(name: str) -> Callable[[dict], None]:
    return lambda record: record["config"].pop(name)


def _static(**values: Any) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        record["static_key"] = json.dumps({**json.loads(record["static_key"]), **values},
                                          sort_keys=True)
    return change


def _drop(name: str) -> Callable[[dict], None]:
    return lambda record: record.pop(name)


@dataclasses.dataclass(frozen=True)
class BadRow:
    """How a valid record is spoiled, the column the refusal names (a JSON export's; a CSV's
    config column is config_json) and a part of the reason it gives in either format."""

    name: str
    spoil: Callable[[dict], None]
    field: str
    reason: str

    def column(self, fmt: str) -> str:
        return "config_json" if fmt == "csv" and self.field == "config" else self.field


BAD_ROWS = (
    BadRow("unknown-kernel", _set(kernel_name="nosuch"), "kernel_name",
           "unknown kernel 'nosuch': known kernels are"),
    BadRow("bucket-negative", _set(bucket=-4), "bucket",
           "-4 is not a power of two from 1 to 1048576"),
    BadRow("bucket-not-a-power-of-two", _set(bucket=3), "bucket",
           "3 is not a power of two from 1 to 1048576"),
    BadRow("bucket-above-the-largest", _set(bucket=2**21), "bucket",
           "2097152 is not a power of two from 1 to 1048576"),
    BadRow("bucket-not-an-integer", _set(bucket="eight"), "bucket", "must be an integer"),
    BadRow("config-vector-bits-7", _knobs(vector_bits=7), "config",
           "vector_bits=7 is not one of (32, 64, 128)"),
    BadRow("config-unknown-knob", _knobs(policy="fast"), "config",
           "unknown knob 'policy' (the knobs are vector_bits, heads_per_warp, warps_per_block)"),
    BadRow("config-missing-knob", _drop_knob("vector_bits"), "config",
           "missing knob 'vector_bits'"),
    BadRow("config-violates-a-constraint", _knobs(heads_per_warp=32), "config",
           "violates head_fits_registers: a thread may hold at most 64 elements of its head"),
    BadRow("config-not-an-object", _set(config=7), "config", "'7' is not a JSON object"),
    BadRow("static-key-head-dim-negative", _static(head_dim=-5), "static_key",
           "head_dim -5 not supported: use one of (64, 128, 256)"),
    BadRow("static-key-unknown-field", _static(hidden=4096), "static_key",
           "unknown field 'hidden'"),
    BadRow("static-key-wrong-type", _static(head_dim="128"), "static_key",
           "head_dim must be of type int, got '128'"),
    BadRow("static-key-not-json", _set(static_key="{dtype: bf16"), "static_key",
           "is not JSON"),
    BadRow("median-negative", _set(median_us=-1.0), "median_us",
           "must be a finite positive number, got"),
    BadRow("median-zero", _set(median_us=0.0), "median_us",
           "must be a finite positive number, got"),
    BadRow("median-nan", _set(median_us=float("nan")), "median_us",
           "must be a finite positive number, got"),
    BadRow("gbps-inf", _set(gbps=float("inf")), "gbps",
           "must be a finite number >= 0 or empty, got"),
    BadRow("iqr-negative", _set(iqr_us=-0.5), "iqr_us",
           "must be a finite number >= 0 or empty, got"),
    BadRow("gpu-name-null", _set(gpu_name=None), "gpu_name", "must be a non-empty string"),
    BadRow("gpu-without-a-device-spec", _set(gpu_name="NVIDIA A100-SXM4-80GB"), "gpu_name",
           "no DeviceSpec for GPU 'NVIDIA A100-SXM4-80GB'"),
    BadRow("sm-count-zero", _set(sm_count=0), "sm_count", "must be a positive integer, got"),
    BadRow("driver-empty", _set(driver=""), "driver", "must be a non-empty string"),
    BadRow("updated-at-without-a-zone", _set(updated_at="2026-11-30T10:00:00"), "updated_at",
           "must be an ISO 8601 time with its time zone"),
    BadRow("missing-column", _drop("median_us"), "median_us", "missing"),
)


def spoiled(bad: BadRow) -> list[dict[str, Any]]:
    """The valid records with one more between them (row 2), spoiled as `bad` says."""
    first, *rest = valid_records()
    extra = as_record(dataclasses.replace(valid_winners()[0], bucket=64))
    bad.spoil(extra)
    return [first, extra, *rest]


def unusable_runs() -> list[tuple[DeviceFingerprint, TuningResult]]:
    """Stored qk_norm winners of Qwen3-8B, of today's source, that qk_norm cannot use: a
    bucket outside the policy, a config of a choice it lacks, one with a knob it lacks. Each
    as the one-trial run an import stores, for writing past the import's checks."""
    def run(bucket: int, config: dict) -> TuningResult:
        trial = TrialRecord(0, json.dumps(config, sort_keys=True), "ok", None, 1.0, 0.01, None,
                            100.0, 50.0, None)
        return TuningResult(qk.KERNEL.name, qk.KERNEL.source_hash(), PROBLEM.static_key(),
                            bucket, bucket, f"stored {bucket}", MEASURED_AT, MEASURED_AT,
                            (trial,), 0)

    knobs = dataclasses.asdict(SMALL)
    return [(FINGERPRINT, run(3, knobs)),
            (FINGERPRINT, run(16, {**knobs, "vector_bits": 7})),
            (FINGERPRINT, run(32, {**knobs, "policy": "fast"}))]


# What each of unusable_runs() is skipped for, by bucket.
UNUSABLE_REASONS = {3: "bucket: 3 is not a power of two",
                    16: "config_json: vector_bits=7 is not one of (32, 64, 128)",
                    32: "config_json: unknown knob 'policy'"}
