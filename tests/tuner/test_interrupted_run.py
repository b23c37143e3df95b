"""A tuning run killed with SIGKILL in the middle of a bucket, then started again, ends where an
uninterrupted run ends: the same winners, no stored point timed again, one winner per bucket,
no trial left RUNNING, and a sound database."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from cutetune.results_db import Database, winners
from cutetune.tuner.study import OUTCOME_ATTR
from testkit import fault_run
from testkit.child_process import child_env
from testkit.fault_kernel import FAKE_TRIAL_SECONDS, measured_log
from testkit.fault_run import GRACE_ENV, GRACE_S, LEASE_ENV, LONG_GRACE_S, run

BUDGET, BUCKETS = 6, [16, 32]
KILL_AFTER_TRIALS = BUDGET + 2  # the first bucket finished, the second two trials in
# The killed run's claim on its bucket in hand: the resumed run (another owner) takes the
# bucket over once this lease has expired, so a short one (renewed every quarter) keeps the
# test from waiting out production's minute.
KILLED_LEASE_S = 2


def stored_outcomes(db_path: Path) -> int:
    with sqlite3.connect(db_path) as connection:
        try:
            return connection.execute("SELECT COUNT(*) FROM trial_user_attributes WHERE key = ?",
                                      (OUTCOME_ATTR,)).fetchone()[0]
        except sqlite3.OperationalError:  # Optuna has not created its tables yet
            return 0


def running_with_a_point(db_path: Path) -> int:
    """Trials RUNNING that have their point: a trial in hand, past its ask."""
    with sqlite3.connect(db_path) as connection:
        try:
            return connection.execute(
                "SELECT COUNT(DISTINCT t.trial_id) FROM trials t JOIN trial_params p "
                "ON p.trial_id = t.trial_id WHERE t.state = 'RUNNING'").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def study_trials(url: str) -> dict[str, list[optuna.trial.FrozenTrial]]:
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=url).trials
            for s in optuna.get_all_study_summaries(url)}


def outcome_keys(url: str) -> set[tuple[int, str]]:
    """(bucket, config JSON) of every trial that carries an outcome."""
    return {(int(name.split(" / ")[2].split()[0]), json.dumps(t.params, sort_keys=True))
            for name, trials in study_trials(url).items() for t in trials
            if OUTCOME_ATTR in t.user_attrs}


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    reference_url = f"sqlite:///{tmp_path / 'reference.db'}"
    reference = run(reference_url, tmp_path / "reference", BUDGET, BUCKETS)

    db_path, cache = tmp_path / "killed.db", tmp_path / "cache"
    url = f"sqlite:///{db_path}"
    killed = subprocess.Popen(
        [sys.executable, "-m", "testkit.fault_run", url, str(cache), str(BUDGET),
         *map(str, BUCKETS)],
        env=child_env(**{FAKE_TRIAL_SECONDS: "0.5", LEASE_ENV: str(KILLED_LEASE_S)}))
    deadline = time.monotonic() + 180
    while stored_outcomes(db_path) < KILL_AFTER_TRIALS:
        assert killed.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the run did not get far enough"
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    before = outcome_keys(url)
    running = [t for trials in study_trials(url).values() for t in trials
               if t.state == optuna.trial.TrialState.RUNNING]
    assert len(before) >= KILL_AFTER_TRIALS and len(running) <= 1
    measured_before = len(measured_log(cache))
    time.sleep(GRACE_S + 1)  # the dead run's trial in hand is now stale

    resumed = run(url, cache, BUDGET, BUCKETS)

    assert [(s.bucket, s.winner_json, s.median_us) for s in resumed] == [
        (s.bucket, s.winner_json, s.median_us) for s in reference]
    # Every trial stored before the kill is kept and was not timed again.
    after = outcome_keys(url)
    assert before <= after
    again = {(tokens, config) for _, tokens, config in measured_log(cache)[measured_before:]}
    assert again and not again & before
    unfinished = [(name, t.number, t.state, t.params, t.user_attrs)
                  for name, trials in study_trials(url).items() for t in trials
                  if not t.state.is_finished()]
    assert not unfinished
    db = Database.open(url)
    stored = winners(db, kernel_name="fault_injection")
    assert sorted(w.bucket for w in stored) == BUCKETS  # one winner per bucket
    with sqlite3.connect(db_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_run_killed_in_a_trial_and_resumed_at_once_leaves_no_trial_running(tmp_path):
    """Issue 38: killed with SIGKILL during a trial, resumed immediately (the killed trial's
    heartbeat still fresh), finished, and run again: no study keeps a RUNNING trial."""
    db_path, cache = tmp_path / "killed.db", tmp_path / "cache"
    url = f"sqlite:///{db_path}"
    killed = subprocess.Popen(
        [sys.executable, "-m", "testkit.fault_run", url, str(cache), str(BUDGET),
         *map(str, BUCKETS)],
        env=child_env(**{FAKE_TRIAL_SECONDS: "0.5", GRACE_ENV: str(LONG_GRACE_S),
                         LEASE_ENV: str(KILLED_LEASE_S)}))
    deadline = time.monotonic() + 180
    while stored_outcomes(db_path) < 2 or not running_with_a_point(db_path):
        assert killed.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the run did not get far enough"
        time.sleep(0.02)
    killed.kill()
    killed.wait()

    def running() -> list[tuple[str, int]]:
        return [(name, t.number) for name, trials in study_trials(url).items() for t in trials
                if t.state == optuna.trial.TrialState.RUNNING]

    assert len(running()) == 1  # killed in a trial

    resumed = run(url, cache, BUDGET, BUCKETS, grace_s=LONG_GRACE_S)
    assert [s.bucket for s in resumed] == BUCKETS and all(s.winner_json for s in resumed)
    assert running() == []
    again = run(url, cache, BUDGET, BUCKETS, grace_s=LONG_GRACE_S)
    assert all(s.status == "stored" for s in again)
    assert running() == []


@pytest.mark.parametrize(("gpus", "buckets"), [("", ["16"]), ("0,1", ["16", "32"])],
                         ids=["one-gpu", "two-gpus"])
def test_ctrl_c_fails_the_trial_in_hand_and_stores_no_half_bucket(tmp_path, gpus, buckets):
    """With two GPU workers, a bucket in hand on each: both trials in hand are failed, both
    threads stop, and no half bucket is stored."""
    db_path, cache = tmp_path / "interrupted.db", tmp_path / "cache"
    url = f"sqlite:///{db_path}"
    interrupted = subprocess.Popen(
        [sys.executable, "-m", "testkit.fault_run", url, str(cache), str(BUDGET), *buckets],
        env=child_env(**{FAKE_TRIAL_SECONDS: "0.5", fault_run.FAKE_GPUS: gpus}),
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while stored_outcomes(db_path) < 2:
        assert interrupted.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    interrupted.send_signal(signal.SIGINT)
    assert interrupted.wait(60) != 0
    assert "KeyboardInterrupt" in interrupted.stderr.read()
    trials = [t for trials in study_trials(url).values() for t in trials]
    assert len([t for t in trials if OUTCOME_ATTR in t.user_attrs]) >= 2
    # The trial in hand was failed at once.
    assert [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING] == []
    assert winners(Database.open(url), kernel_name="fault_injection") == []


@pytest.mark.gpu
def test_the_cli_killed_on_the_gpu_resumes_to_the_uninterrupted_winners(tmp_path):
    """`cutetune tune` of a real kernel, killed mid-bucket and run again, against an
    uninterrupted run of the same command: the same buckets won within the timing noise."""
    command = ["tune", "qk_norm", "--model", "qwen3-0.6b", "--tokens", "8,4096",
               "--trials", "6"]
    env = {**os.environ, "CUTETUNE_CACHE_DIR": str(tmp_path / "cache")}

    def cli(db: Path, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cutetune.cli.main", "--db",
                                 f"sqlite:///{db}", *command], env=env, **kwargs)

    assert cli(tmp_path / "reference.db").wait(300) == 0
    db_path = tmp_path / "killed.db"
    killed = cli(db_path)
    deadline = time.monotonic() + 240
    while stored_outcomes(db_path) < 8:
        assert killed.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    before = outcome_keys(f"sqlite:///{db_path}")
    resumed = cli(db_path, stdout=subprocess.PIPE, text=True)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output

    reference = winners(Database.open(f"sqlite:///{tmp_path / 'reference.db'}"), None, "qk_norm")
    stored = winners(Database.open(f"sqlite:///{db_path}"), None, "qk_norm")
    assert [w.bucket for w in stored] == [w.bucket for w in reference] == [8, 4096]
    for ours, theirs in zip(stored, reference, strict=True):
        assert abs(ours.median_us - theirs.median_us) <= 0.05 * theirs.median_us + 0.1, (
            ours, theirs)
    assert before <= outcome_keys(f"sqlite:///{db_path}")
    with sqlite3.connect(db_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
