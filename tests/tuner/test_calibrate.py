"""`cutetune calibrate` (issue 42 item 1): a device's stored trials fitted and stored, read
back by the tuner's query and by the warmup's sqlite3 reader alike; too few trials is one line
and stores nothing."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.device.calibrated import CalibratedModel
from cutetune.device.calibration_fit import MIN_TRIALS
from cutetune.kernels.registry import get_kernel
from cutetune.results_db import (
    Database,
    TrialRecord,
    TuningResult,
    calibration_to_serve,
    calibration_to_serve_at,
    record_tuning_result,
)
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from testkit.fake_qk_runner import FINGERPRINT, SPEC

KNOWN = CalibratedModel(gpu_name="NVIDIA H200", launch_us=1.2, wave_us=0.3, barrier_us=2.0,
                        us_per_mb=0.23, in_flight_bytes=16384.0, prune_factor=1.2, trials=0,
                        median_error=0.0, datasheet_error=0.0, over_2x=0.0)
KERNEL = get_kernel("rmsnorm")
STATIC = KERNEL.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]


def store_trials(db: Database, buckets: tuple[int, ...], per_bucket: int | None = None) -> list:
    """Every valid rmsnorm point of qwen3-8b at `buckets` (the first `per_bucket` of each),
    timed by KNOWN; the costs stored."""
    costs = []
    for bucket in buckets:
        problem = STATIC.with_tokens(bucket)
        configs = KERNEL.space.enumerate(problem, SPEC).valid[:per_bucket]
        trials = []
        for number, config in enumerate(configs):
            cost = KERNEL.cost(problem, config, SPEC)
            costs.append(cost)
            trials.append(TrialRecord(number, config_to_json(config), "ok", None,
                                      KNOWN.predict_us(cost, SPEC), 0.01, 10, None, None, None))
        trials.append(TrialRecord(len(trials), config_to_json(configs[0]), "failed",
                                  "wrong result", None, None, None, None, None, None))
        now = datetime(2026, 12, 3, tzinfo=UTC)
        record_tuning_result(db, FINGERPRINT, TuningResult(
            "rmsnorm", KERNEL.source_hash(), STATIC.static_key(), bucket, bucket,
            f"rmsnorm-{bucket}", now, now, tuple(trials), None))
    return costs


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


def test_calibrate_fits_stores_and_both_readers_read_it_back(url):
    db = Database.open(url)
    costs = store_trials(db, (1, 64, 4096, 32768))
    result = CliRunner().invoke(cli, ["--db", url, "calibrate"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("NVIDIA H200 (torch 2.11, CuTeDSL 4.8.1): launch 1.20 us")
    stored = calibration_to_serve(db, FINGERPRINT)
    assert stored is not None and stored.trials == len(costs)  # the failed trials left out
    for cost in costs:
        assert stored.predict_us(cost, SPEC) == pytest.approx(KNOWN.predict_us(cost, SPEC),
                                                              rel=1e-6)
    assert calibration_to_serve_at(url, FINGERPRINT) == stored
    # Another torch on the same GPU and CuTeDSL uses it; another GPU does not.
    assert calibration_to_serve_at(url, dataclasses.replace(FINGERPRINT, torch="2.12")) == stored
    other_gpu = dataclasses.replace(FINGERPRINT, gpu_name="NVIDIA H100 80GB HBM3")
    assert calibration_to_serve(db, other_gpu) is None
    assert calibration_to_serve_at(url, other_gpu) is None
    db.dispose()


def test_too_few_trials_is_one_line_and_stores_nothing(url):
    db = Database.open(url)
    store_trials(db, (64,), per_bucket=3)
    result = CliRunner().invoke(cli, ["--db", url, "calibrate"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: NVIDIA H200 (torch 2.11, CuTeDSL 4.8.1): NVIDIA H200: 3 verified trials "
        f"stored, calibration needs at least {MIN_TRIALS}; nothing stored"]
    assert calibration_to_serve(db, FINGERPRINT) is None
    db.dispose()


def test_a_database_without_trials_says_so(url):
    Database.open(url).dispose()
    result = CliRunner().invoke(cli, ["--db", url, "calibrate"])
    assert result.exit_code == 1
    assert "holds no device's trials: run cutetune tune first" in result.output


def test_a_database_from_before_calibrations_reads_as_none_without_creating_the_table(url):
    db = Database.open(url)
    store_trials(db, (64,), per_bucket=3)
    with db.engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE calibrations")
    db.dispose()
    assert calibration_to_serve_at(url, FINGERPRINT) is None
    import sqlite3

    connection = sqlite3.connect(url.removeprefix("sqlite:///"))
    tables = {name for (name,) in connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    connection.close()
    assert "calibrations" not in tables


def test_plan_ranks_with_a_stored_calibration_and_prints_each_points_terms(url):
    db = Database.open(url)
    store_trials(db, (1, 64, 4096, 32768))
    db.dispose()
    assert CliRunner().invoke(cli, ["--db", url, "calibrate"]).exit_code == 0
    args = ["--db", url, "plan", "rmsnorm", "-m", "qwen3-8b", "--tokens", "32768", "--top", "3"]
    out = CliRunner().invoke(cli, args).output
    assert out.startswith("cost model: calibrated for NVIDIA H200: launch 1.20 us")
    assert "by the calibrated model: predicted over" in out
    assert "the datasheet roofline alone would keep" in out
    assert ["rank", "predicted", "us", "launch", "waves", "(n)", "barrier", "memory", "(bytes,",
            "efficiency)", "config"] in [line.split() for line in out.splitlines()]
    # The first ranked point's terms add up to its predicted time.
    first = next(line for line in out.splitlines() if line.strip().startswith("1."))
    predicted, launch, waves, _, barrier, memory = first.split()[1:7]
    assert float(predicted) == pytest.approx(
        float(launch) + float(waves) + float(barrier) + float(memory), abs=0.02)
    datasheet = CliRunner().invoke(cli, [*args, "--datasheet"]).output
    assert datasheet.startswith("cost model: datasheet roofline")
    assert "by the datasheet roofline: predicted over 2x" in datasheet
