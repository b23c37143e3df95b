"""benchmarks/tune_eta.py: the readings of a run (the fault kernel with the fake GPU worker, a
real compile pool) are the ETA the progress display showed after each trial, and the table
puts the first reading at or past each share beside the truth and the mean-rate ETA."""

import pytest
import torch

from benchmarks import tune_eta
from benchmarks.tune_eta import Reading, RecordedRun, record_run, rows
from cutetune.results_db import Database
from cutetune.tuner.model_run import RunOptions
from testkit.fault_run import fault_workers
from testkit.sound_fault_points import UNITS, sound_points_only


def test_each_share_takes_the_first_reading_at_or_past_it():
    readings = [Reading(elapsed_s=10.0 * done, done=done, eta_s=300.0 - 10 * done,
                        kernel="k", gpu_busy_s=0.0, compile_wait_s=0.0, compile_cpu_s=0.0)
                for done in range(1, 21)]
    table = rows(RecordedRun(readings, planned=20, run_s=250.0))
    assert [(r["share_pct"], r["trials_done"]) for r in table] == [(5, 1), (25, 5), (50, 10)]
    at_25 = table[1]
    assert at_25["elapsed_s"] == 50.0 and at_25["eta_s"] == 250.0
    assert at_25["true_remaining_s"] == 200.0 and at_25["eta_error_pct"] == 25.0
    # The old ETA: 50 s for 5 trials, so 10 s a trial for the 15 left.
    assert at_25["mean_rate_eta_s"] == 150.0 and at_25["mean_rate_error_pct"] == -25.0


def test_a_recorded_run_has_a_reading_per_trial(tmp_path, capsys):
    db = Database.open(f"sqlite:///{tmp_path / 'eta.db'}")
    sound_points_only(db)
    run = record_run(UNITS, [1, 2], db, fault_workers(tmp_path / "cache"), RunOptions(3))
    db.dispose()
    assert run.planned == 6 and [r.done for r in run.readings] == list(range(1, 7))
    assert all(r.eta_s >= 0 for r in run.readings)
    # Each reading names its trial's kernel and the run's time split so far, which only grows.
    assert {r.kernel for r in run.readings} == {unit.kernel.name for unit in UNITS}
    for earlier, later in zip(run.readings, run.readings[1:], strict=False):
        assert later.gpu_busy_s >= earlier.gpu_busy_s
        assert later.compile_wait_s >= earlier.compile_wait_s
        assert later.compile_cpu_s >= earlier.compile_cpu_s
    assert run.readings[-1].compile_cpu_s > 0  # the pool compiled the fault kernel's points
    # Each compile is kept by kernel: their seconds hold what the readings summed (and those
    # the pool finished after the last trial, compiling ahead).
    assert {c.kernel for c in run.compiles} <= {unit.kernel.name for unit in UNITS}
    assert sum(c.seconds for c in run.compiles) >= run.readings[-1].compile_cpu_s
    assert run.readings[-1].elapsed_s < run.run_s
    assert [r["trials_done"] for r in rows(run)] == [1, 2, 3]
    assert "ETA" in capsys.readouterr().err  # the display's lines, as the CLI shows them


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_without_a_gpu_it_stops_with_one_line(monkeypatch):
    monkeypatch.setattr("sys.argv", ["tune_eta", "--model", "qwen3-0.6b"])
    with pytest.raises(SystemExit, match="tunes on a CUDA GPU and none is visible"):
        tune_eta.main()
