"""`cutetune calibrate` (issue 42 item 1): a device's stored trials fitted and stored, read
back by the tuner's query and by the warmup's sqlite3 reader alike; too few trials is one line
and stores nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.device.calibration_fit import MIN_TRIALS
from cutetune.results_db import Database, calibration_to_serve, calibration_to_serve_at
from testkit.fake_qk_runner import FINGERPRINT
from testkit.known_cost_model import KNOWN, SPEC, store_known_trials


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


def test_calibrate_fits_stores_and_both_readers_read_it_back(url):
    db = Database.open(url)
    costs = store_known_trials(db, FINGERPRINT, (1, 64, 4096, 32768))
    result = CliRunner().invoke(cli, ["--db", url, "calibrate"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("NVIDIA H200 (torch 2.11, CuTeDSL 4.8.1): launch 1.10 us")
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


def test_calibrate_fits_knob_factors_for_a_kernel_tuned_for_two_problems(url):
    db = Database.open(url)
    store_known_trials(db, FINGERPRINT, (1, 4096))
    store_known_trials(db, FINGERPRINT, (1, 4096), model="qwen3-0.6b")
    result = CliRunner().invoke(cli, ["--db", url, "calibrate"])
    assert result.exit_code == 0, result.output
    assert "knob factors, cross-validated prune: rmsnorm 1.10x" in result.output
    stored = calibration_to_serve(db, FINGERPRINT)
    # The trials follow the terms exactly: the knobs' factors are 1 and prune at the floor.
    assert set(stored.knobs.log_factors["rmsnorm"]) == {1, 4096}
    assert all(abs(f) < 1e-9 for by_knob in stored.knobs.log_factors["rmsnorm"].values()
               for f in by_knob.values())
    assert calibration_to_serve_at(url, FINGERPRINT) == stored
    db.dispose()


def test_too_few_trials_is_one_line_and_stores_nothing(url):
    db = Database.open(url)
    store_known_trials(db, FINGERPRINT, (64,), per_bucket=3)
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
    store_known_trials(db, FINGERPRINT, (64,), per_bucket=3)
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
    store_known_trials(db, FINGERPRINT, (1, 64, 4096, 32768))
    db.dispose()
    assert CliRunner().invoke(cli, ["--db", url, "calibrate"]).exit_code == 0
    args = ["--db", url, "plan", "rmsnorm", "-m", "qwen3-8b", "--tokens", "32768", "--top", "3"]
    out = CliRunner().invoke(cli, args).output
    assert out.startswith("cost model: calibrated for NVIDIA H200: launch 1.10 us")
    assert "by the calibrated model: predicted over" in out
    assert "the datasheet roofline alone would keep" in out
    assert ["rank", "predicted", "us", "launch", "waves", "(n)", "barrier", "memory", "(bytes,",
            "efficiency)", "knobs", "config"] in [line.split() for line in out.splitlines()]
    # The first ranked point's terms add up to its predicted time.
    first = next(line for line in out.splitlines() if line.strip().startswith("1."))
    predicted, launch, waves, _, barrier, memory = first.split()[1:7]
    assert float(predicted) == pytest.approx(
        float(launch) + float(waves) + float(barrier) + float(memory), abs=0.02)
    datasheet = CliRunner().invoke(cli, [*args, "--datasheet"]).output
    assert datasheet.startswith("cost model: datasheet roofline")
    assert "by the datasheet roofline: predicted over 2x" in datasheet


def test_cache_build_plans_the_calibrated_picks_and_keeps_them_for_the_gpu_host(
        url, tmp_path, monkeypatch):
    from cutetune.serving.plan import PREDICTED
    from cutetune.serving.predicted import PICKS_FILE

    db = Database.open(url)
    store_known_trials(db, FINGERPRINT, (1, 64, 4096, 32768))
    db.dispose()
    assert CliRunner().invoke(cli, ["--db", url, "calibrate"]).exit_code == 0
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path / "cache"))
    planned = []

    def planned_only(plan, store, work, jobs):  # what would be compiled, compiling nothing
        planned.extend(e for kernel, problems in work for p in problems
                       for e in plan.entries(kernel, p))
        return len(planned), 0

    monkeypatch.setattr("cutetune.serving.precompile.precompile", planned_only)
    result = CliRunner().invoke(cli, ["--db", url, "cache", "build", "--model", "qwen3-0.6b"])
    assert result.exit_code == 0, result.output
    assert PREDICTED in {e.source for e in planned}
    assert list((tmp_path / "cache").rglob(PICKS_FILE))
