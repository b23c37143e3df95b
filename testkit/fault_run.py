"""Tunes the fault kernel with the fake GPU worker: in a test, or as a process a test kills.

    python -m testkit.fault_run DB_URL CACHE_DIR BUDGET BUCKET [BUCKET ...]

As a process, with a fake worker per GPU where FAKE_GPUS (e.g. "0,1") names them, the
heartbeat grace period GRACE_ENV and the buckets' lease LEASE_ENV where they are set; where
START_ENV names a file, the run starts tuning only once that file exists, having written
`<file>.ready.<pid>` when its workers were up (so that a test times the tuning of several
processes started together, not their start).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from optuna.storages import BaseStorage  # noqa: E402

from cutetune.results_db import Database, QuarantinedPoint, record_quarantine  # noqa: E402
from cutetune.spaces.space import config_to_json  # noqa: E402
from cutetune.tuner.bucket_claims import DEFAULT_LEASE_S  # noqa: E402
from cutetune.tuner.isolated import Workers  # noqa: E402
from cutetune.tuner.model_run import BucketSummary, RunOptions, Unit, tune_model  # noqa: E402
from cutetune.tuner.study_storage import open_storage  # noqa: E402
from testkit.fault_kernel import FAKE_FINGERPRINT, FAULTY_POINTS, KERNEL, FaultProblem  # noqa: E402

# Heartbeats every second, stale after two: a test need not wait long for a dead run's trial.
HEARTBEAT_S, GRACE_S = 1, 2
# A grace period no test outlasts, as a resume within production's 30 s sees it: no trial of a
# killed run is failed by its heartbeat going stale.
LONG_GRACE_S = 3600
TRIAL_TIMEOUT_S = 2.0


class Silent:
    def started(self, *args) -> None:
        pass

    bucket_started = trial = bucket_finished = started


class StartsTogether(Silent):
    """Says it is ready, then waits for the start file before the first bucket."""

    def __init__(self, start_file: Path):
        self.start_file = start_file

    def started(self, *args) -> None:
        Path(f"{self.start_file}.ready.{os.getpid()}").touch()
        while not self.start_file.exists():
            time.sleep(0.01)


def sound_points_only(url: str) -> None:
    """Quarantine the fault kernel's faulty points, so that a run tries its three sound ones."""
    db = Database.open(url)
    try:
        for config in FAULTY_POINTS:
            record_quarantine(db, FAKE_FINGERPRINT, QuarantinedPoint(
                KERNEL.name, KERNEL.source_hash(), FaultProblem(num_tokens=1).static_key(),
                config_to_json(config), 1, "kept out by the test", datetime.now(UTC)))
    finally:
        db.dispose()


def fault_workers(cache_dir: Path, gpu_worker: str = "testkit.fault_kernel:FakeGpuWorker",
                  trial_timeout_s: float = TRIAL_TIMEOUT_S,
                  gpus: tuple[int, ...] | None = None) -> Workers:
    return Workers(cache_dir, ["testkit.fault_kernel"], compile_processes=1,
                   trial_timeout_s=trial_timeout_s, gpu_worker=gpu_worker, gpus=gpus)


def run(db_url: str, cache_dir: Path, budget: int, buckets: list[int],
        retry_failed: bool = False, workers: Workers | None = None,
        grace_s: int = GRACE_S, lease_s: float = DEFAULT_LEASE_S,
        observer: Silent | None = None, storage: BaseStorage | None = None,
        force: bool = False) -> list[BucketSummary]:
    """Tune the fault kernel at `buckets`; Optuna's studies in `storage`, by default the
    database with heartbeats every HEARTBEAT_S."""
    db = Database.open(db_url)
    try:
        return tune_model([Unit(KERNEL, FaultProblem(num_tokens=1))], buckets, db,
                          workers or fault_workers(cache_dir),
                          RunOptions(budget, force=force, retry_failed=retry_failed,
                                     lease_s=lease_s),
                          observer or Silent(),
                          storage=storage or open_storage(db_url, HEARTBEAT_S, grace_s))
    finally:
        db.dispose()


FAKE_GPUS = "CUTETUNE_TEST_FAKE_GPUS"
GRACE_ENV = "CUTETUNE_TEST_GRACE_S"
LEASE_ENV = "CUTETUNE_TEST_LEASE_S"
START_ENV = "CUTETUNE_TEST_START_FILE"

if __name__ == "__main__":
    url, cache, budget, *buckets = sys.argv[1:]
    gpus = os.environ.get(FAKE_GPUS)
    run(url, Path(cache), int(budget), [int(b) for b in buckets],
        workers=fault_workers(Path(cache), gpus=tuple(map(int, gpus.split(","))))
        if gpus else None, grace_s=int(os.environ.get(GRACE_ENV, GRACE_S)),
        lease_s=float(os.environ.get(LEASE_ENV, DEFAULT_LEASE_S)),
        observer=StartsTogether(Path(os.environ[START_ENV])) if START_ENV in os.environ else None)
