"""Tuners sharing one database divide a model's buckets (issue 41, items 1 and 3), on the CPU:
each `testkit.fault_run` process is a whole tuning run (its fake GPU worker sleeping
FAKE_TRIAL_S a trial) on one PostgreSQL database. Four of them store exactly one run and one
winner per bucket, every point of it measured once, in at most 0.35x the time one process
takes; one of four killed with SIGKILL mid-bucket leaves its bucket to the others, who finish
it from its stored trials; two processes share one SQLite file.

The processes are started together once all are up (StartsTogether), and a run's time is from
its start to its last bucket stored: what is compared is the tuning, not the start and end of
Python processes on a CI machine of two cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from cutetune.tuner.model_run import STORED, TUNED
from testkit.child_process import child_env
from testkit.databases import NO_SERVER, postgres_server_url, scratch_url
from testkit.fault_kernel import FAKE_TRIAL_SECONDS, measured_log
from testkit.fault_run import (
    LEASE_ENV,
    START_ENV,
    Silent,
    StartsTogether,
    run,
    sound_points_only,
)

BUDGET = 2  # of the fault kernel's three sound points, the warm start's two
FAKE_TRIAL_S = 0.5
# Where tuners are timed, a trial takes long enough that a bucket's database and process
# overhead (about half a second, more with four tuners on two cores) stays small beside it.
TIMED_TRIAL_S = 1.25


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """An artifact cache the module's tuners share, its points compiled once by a run here:
    each tuner then loads them rather than starting CuTeDSL to compile them again."""
    directory = tmp_path_factory.mktemp("shared") / "cache"
    url = f"sqlite:///{directory.parent / 'warm.db'}"
    sound_points_only(url)
    run(url, directory, BUDGET, [1])
    return directory


@pytest.fixture
def postgres_url(tmp_path):
    if postgres_server_url() is None:
        pytest.skip(NO_SERVER)
    with scratch_url("postgresql", tmp_path, "shared") as url:
        yield url


def start_tuners(count: int, url: str, cache: Path, buckets: list[int], start_file: Path,
                 lease_s: float = 30.0) -> list[subprocess.Popen]:
    env = child_env(**{FAKE_TRIAL_SECONDS: os.environ.get(FAKE_TRIAL_SECONDS, str(FAKE_TRIAL_S)),
                       START_ENV: str(start_file), LEASE_ENV: str(lease_s)})
    return [subprocess.Popen([sys.executable, "-m", "testkit.fault_run", url, str(cache),
                              str(BUDGET), *map(str, buckets)], env=env)
            for _ in range(count)]


def started_together(tuners: list[subprocess.Popen], start_file: Path,
                     count: int | None = None) -> None:
    """Wait until every tuner is up (`count` of them, where some are not `tuners`), start
    them."""
    deadline = time.monotonic() + 120
    while len(list(start_file.parent.glob(f"{start_file.name}.ready.*"))) < (count
                                                                               or len(tuners)):
        assert all(t.poll() is None for t in tuners), "a tuner ended before it started"
        assert time.monotonic() < deadline, "the tuners did not start"
        time.sleep(0.02)
    start_file.touch()


def wait_all(tuners: list[subprocess.Popen]) -> None:
    for tuner in tuners:
        assert tuner.wait(timeout=180) == 0


def rows(url: str, query: str) -> list[tuple]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(query))]
    finally:
        engine.dispose()


def assert_each_bucket_tuned_once(url: str, buckets: list[int]) -> None:
    """One stored run per bucket, with BUDGET points each once, and one winner."""
    runs = rows(url, "SELECT r.bucket, t.config_json FROM tuning_runs r "
                     "JOIN tuning_trials t ON t.run_id = r.id")
    assert Counter(bucket for bucket, _ in runs) == dict.fromkeys(buckets, BUDGET)
    assert len(set(runs)) == len(runs)  # no point twice in a bucket's run
    assert sorted(rows(url, "SELECT bucket FROM tuning_runs")) == [(b,) for b in buckets]
    assert sorted(rows(url, "SELECT bucket FROM winners")) == [(b,) for b in buckets]
    assert rows(url, "SELECT COUNT(*) FROM bucket_claims") == [(0,)]  # all released


def last_stored_after(url: str, start: datetime) -> float:
    """Seconds from `start` to when the last bucket was stored."""
    [(last,)] = rows(url, "SELECT MAX(finished_at) FROM tuning_runs")
    if isinstance(last, str):  # SQLite keeps a time as text
        last = datetime.fromisoformat(last)
    return (last.replace(tzinfo=UTC) - start).total_seconds()


def tune_together(count: int, url: str, tmp_path: Path, cache: Path, buckets: list[int],
                  in_this_process: bool = False) -> float:
    """Tune with `count` tuners started together (one of them this process, where asked);
    seconds from their start to the last bucket stored."""
    start_file = tmp_path / f"start-{count}"
    tuners = start_tuners(count - in_this_process, url, cache, buckets,
                          start_file)
    started: list[datetime] = []

    def start_when_ready() -> None:
        started_together(tuners, start_file, count)
        started.append(datetime.now(UTC))

    starter = threading.Thread(target=start_when_ready)
    starter.start()
    if in_this_process:
        run(url, cache, BUDGET, buckets, observer=StartsTogether(start_file))
    starter.join()
    wait_all(tuners)
    return last_stored_after(url, started[0])


class Clocked(Silent):
    def started(self, *args) -> None:
        self.at = datetime.now(UTC)


def test_four_tuners_on_postgresql_divide_the_buckets(postgres_url, tmp_path, cache,
                                                      monkeypatch):
    buckets = [2 ** n for n in range(8)]
    monkeypatch.setenv(FAKE_TRIAL_SECONDS, str(TIMED_TRIAL_S))
    with scratch_url("postgresql", tmp_path, "alone") as alone_url:
        sound_points_only(alone_url)
        clock = Clocked()
        run(alone_url, cache, BUDGET, buckets, observer=clock)
        alone_s = last_stored_after(alone_url, clock.at)
        assert_each_bucket_tuned_once(alone_url, buckets)
    measured_alone = len(measured_log(cache))
    sound_points_only(postgres_url)
    shared_s = tune_together(4, postgres_url, tmp_path, cache, buckets)

    assert_each_bucket_tuned_once(postgres_url, buckets)
    measured = measured_log(cache)[measured_alone:]
    assert Counter((tokens, config) for _, tokens, config in measured) == {
        (tokens, config): 1 for _, tokens, config in measured}  # each point timed once
    assert len({pid for pid, _, _ in measured}) == 4  # each tuner tuned
    assert shared_s <= 0.35 * alone_s, (shared_s, alone_s)


def test_a_killed_tuners_bucket_is_finished_by_the_others(postgres_url, tmp_path, cache):
    buckets = [2 ** n for n in range(8)]
    sound_points_only(postgres_url)
    start_file = tmp_path / "start"
    tuners = start_tuners(4, postgres_url, cache, buckets, start_file, lease_s=2)
    started_together(tuners, start_file)
    # Kill a tuner holding a bucket whose trials it has begun to store.
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "no tuner got a trial in"
        holders = rows(postgres_url, "SELECT c.owner FROM bucket_claims c "
                                     "JOIN trial_values v ON TRUE LIMIT 1")
        victims = [t for t in tuners for (owner,) in holders if f" pid {t.pid} " in owner]
        if victims:
            break
        time.sleep(0.05)
    victim = victims[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    left_held = rows(postgres_url, "SELECT bucket FROM bucket_claims WHERE owner LIKE "
                                   f"'% pid {victim.pid} %'")
    assert left_held, "the tuner was killed between buckets, holding none"
    wait_all([t for t in tuners if t is not victim])

    assert_each_bucket_tuned_once(postgres_url, buckets)
    assert rows(postgres_url, "SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'") == [(0,)]


def test_two_tuners_share_one_sqlite_file(tmp_path, cache, monkeypatch):
    monkeypatch.setenv(FAKE_TRIAL_SECONDS, str(FAKE_TRIAL_S))
    buckets = [1, 2, 4, 8, 16, 32]
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    sound_points_only(url)
    measured_before = len(measured_log(cache))
    tune_together(2, url, tmp_path, cache, buckets, in_this_process=True)
    assert_each_bucket_tuned_once(url, buckets)
    assert len({pid for pid, _, _ in measured_log(cache)[measured_before:]}) == 2


def test_force_tunes_again_the_buckets_one_tuner_claims(tmp_path, cache):
    url = f"sqlite:///{tmp_path / 'forced.db'}"
    sound_points_only(url)
    run(url, cache, BUDGET, [1, 2])
    assert [s.status for s in run(url, cache, BUDGET, [1, 2])] == [STORED, STORED]
    assert [s.status for s in run(url, cache, BUDGET, [1, 2], force=True)] == [TUNED, TUNED]
    assert sorted(rows(url, "SELECT bucket FROM tuning_runs")) == [(1,), (1,), (2,), (2,)]
