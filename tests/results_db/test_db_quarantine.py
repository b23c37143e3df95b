"""Quarantined points, the stored runs a resumed tuning run reads, and the write check."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DatabaseError

from cutetune.results_db import (
    Database,
    QuarantinedPoint,
    clear_quarantine,
    quarantined_points,
    record_quarantine,
    record_tuning_result,
    stored_runs,
)
from cutetune.results_db.schema import KernelRow

PROBLEM = '{"hidden": 4096}'


def point(config: dict, reason: str = "hang: no answer in 30 s", **changes) -> QuarantinedPoint:
    base = QuarantinedPoint("qk_norm", "5f1e0c", PROBLEM,
                            json.dumps(config, sort_keys=True), 64, reason,
                            datetime(2026, 1, 5, 12, 0, tzinfo=UTC))
    return dataclasses.replace(base, **changes)


def test_quarantine_round_trip_and_filters(db, h200, h100):
    record_quarantine(db, h200, point({"w": 1}))
    record_quarantine(db, h200, point({"w": 2}, "cuda: unspecified launch failure"))
    record_quarantine(db, h100, point({"w": 3}))
    record_quarantine(db, h200, point({"w": 4}, source_hash="newer"))
    found = quarantined_points(db, h200, "qk_norm", "5f1e0c", PROBLEM)
    assert [(json.loads(p.config_json)["w"], p.reason) for _, p in found] == [
        (1, "hang: no answer in 30 s"), (2, "cuda: unspecified launch failure")]
    assert all(device == h200 for device, _ in found)
    assert len(quarantined_points(db)) == 4
    assert quarantined_points(db, kernel_name="rmsnorm") == []


def test_a_point_quarantined_again_keeps_one_row_with_the_latest_reason(db, h200):
    record_quarantine(db, h200, point({"w": 1}))
    record_quarantine(db, h200, point({"w": 1}, "crash: SIGSEGV", bucket=4096))
    ((_, only),) = quarantined_points(db, h200)
    assert (only.reason, only.bucket) == ("crash: SIGSEGV", 4096)


def test_clearing_frees_one_source_problem_and_device_only(db, h200, h100):
    record_quarantine(db, h200, point({"w": 1}))
    record_quarantine(db, h200, point({"w": 2}))
    record_quarantine(db, h100, point({"w": 1}))
    record_quarantine(db, h200, point({"w": 1}, static_key="{}"))
    assert clear_quarantine(db, h200, "qk_norm", "5f1e0c", PROBLEM) == 2
    left = [(device.gpu_name, p.static_key) for device, p in quarantined_points(db)]
    assert sorted(left) == [("NVIDIA H100 80GB HBM3", PROBLEM), ("NVIDIA H200", "{}")]


def test_stored_runs_hold_the_latest_run_of_each_bucket_with_its_winner(db, h200, h100,
                                                                       make_result,
                                                                       failed_trial):
    record_tuning_result(db, h200, make_result(bucket=16))
    record_tuning_result(db, h200, make_result(bucket=16, median_us=1.0))
    everything_failed = dataclasses.replace(
        make_result(bucket=64), trials=(failed_trial(0, 4, "wrong result"),), winner_number=None)
    record_tuning_result(db, h200, everything_failed)
    record_tuning_result(db, h100, make_result(bucket=256))
    record_tuning_result(db, h200, make_result(bucket=512, source_hash="newer"))
    runs = stored_runs(db, h200, "qk_norm", "5f1e0c", make_result().static_key)
    assert sorted(runs) == [16, 64]
    assert (runs[16].trials, runs[16].failed, runs[16].winner.median_us) == (3, 1, 1.0)
    assert (runs[64].trials, runs[64].failed, runs[64].winner) == (1, 1, None)


def test_the_write_check_writes_nothing_and_refuses_a_read_only_database(tmp_path):
    path = tmp_path / "results.db"
    db = Database.open(f"sqlite:///{path}")
    db.check_writable()
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(KernelRow)) == 0
    db.dispose()
    read_only = Database.open(f"sqlite:///file:{path}?mode=ro&uri=true")
    with pytest.raises(DatabaseError, match="readonly"):
        read_only.check_writable()
