"""A tuning run with a GPU worker per GPU, on the CPU: two fake GPU workers (real supervised
processes, each started with only its GPU visible) take the buckets between them, each bucket's
trials and re-measurement on one of them, and the run stores what one worker's run stores. The
fault kernel's faulty points are quarantined beforehand, so only its three sound points run."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cutetune.results_db import Database, QuarantinedPoint, record_quarantine, winners
from cutetune.spaces.space import config_to_json
from cutetune.tuner import isolated
from cutetune.tuner.isolated import MixedGpusError, TimeSplit
from cutetune.tuner.model_run import TUNED
from testkit.fault_kernel import FAKE_FINGERPRINT, FAULTY_POINTS, KERNEL, FaultProblem, measured_log
from testkit.fault_run import fault_workers, run

BUCKETS = [1, 2, 4, 8, 16]


def sound_points_only(url: str) -> None:
    db = Database.open(url)
    try:
        for config in FAULTY_POINTS:
            record_quarantine(db, FAKE_FINGERPRINT, QuarantinedPoint(
                KERNEL.name, KERNEL.source_hash(), FaultProblem(num_tokens=1).static_key(),
                config_to_json(config), 1, "kept out by the test", datetime.now(UTC)))
    finally:
        db.dispose()


def stored_winners(url: str) -> dict[int, str]:
    db = Database.open(url)
    try:
        return {w.bucket: w.config_json for w in winners(db, kernel_name=KERNEL.name)}
    finally:
        db.dispose()


def test_two_gpu_workers_share_the_buckets_and_store_what_one_stores(tmp_path):
    one_url, two_url = (f"sqlite:///{tmp_path / name}" for name in ("one.db", "two.db"))
    cache = tmp_path / "cache"  # the second run loads the first run's compiled points
    for url in (one_url, two_url):
        sound_points_only(url)

    alone = run(one_url, cache, budget=3, buckets=BUCKETS)
    measured_alone = len(measured_log(cache))
    workers = fault_workers(cache, gpus=(0, 1))
    shared = run(two_url, cache, budget=3, buckets=BUCKETS, workers=workers)

    assert [(s.bucket, s.status, s.trials) for s in shared] == [(b, TUNED, 3) for b in BUCKETS]
    assert [(s.winner_json, s.median_us) for s in shared] == [
        (s.winner_json, s.median_us) for s in alone]
    assert stored_winners(two_url) == stored_winners(one_url)
    log = measured_log(cache)[measured_alone:]
    by_bucket = {}
    for pid, tokens, _ in log:
        by_bucket.setdefault(tokens, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_bucket.values())  # a bucket on one worker
    assert len({pid for pid, _, _ in log}) == 2  # both workers tuned
    assert workers.split.gpus == 2 and workers.split.workers_lost == 0


def test_gpus_of_two_models_are_refused_before_a_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'mixed.db'}"
    workers = fault_workers(tmp_path / "cache", gpu_worker="testkit.fault_kernel:MixedGpus",
                            gpus=(0, 1))
    with pytest.raises(MixedGpusError, match=(
            r"GPU 1 is a NVIDIA H100 80GB HBM3 \(compute capability 9.0, 132 SMs, CuTeDSL "
            r"4.8.1\) but GPU 0 a NVIDIA H200 .*: one run tunes GPUs of one model")):
        run(url, tmp_path / "cache", budget=3, buckets=[1], workers=workers)
    assert measured_log(tmp_path / "cache") == []
    assert not any(gpu.alive for gpu in workers.gpus)


def test_an_error_in_one_workers_thread_stops_the_run(tmp_path, monkeypatch):
    url, cache = f"sqlite:///{tmp_path / 'broken.db'}", tmp_path / "cache"
    sound_points_only(url)

    class BrokenAtFour:
        def started(self, *args) -> None:
            pass

        trial = bucket_finished = started

        def bucket_started(self, planned, expected_trials) -> None:
            if planned.bucket == 4:
                raise RuntimeError("the observer broke at bucket 4")

    from cutetune.tuner import model_run
    from cutetune.tuner.study_storage import open_storage

    db = Database.open(url)
    with pytest.raises(RuntimeError, match="the observer broke at bucket 4"):
        model_run.tune_model([model_run.Unit(KERNEL, FaultProblem(num_tokens=1))], BUCKETS, db,
                             fault_workers(cache, gpus=(0, 1)), model_run.RunOptions(3),
                             BrokenAtFour(), storage=open_storage(url, 1, 2))
    tuned = {tokens for _, tokens, _ in measured_log(cache)}
    assert 4 not in tuned and 16 not in tuned  # the run stopped taking buckets
    # The bucket a worker finished first is stored whole (the other worker's bucket in hand
    # may have stopped at a safe point, unstored); the next run tunes the rest.
    assert set() < set(stored_winners(url)) <= tuned
    db.dispose()


def test_each_worker_sees_only_its_gpu_as_this_process_numbers_them(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert isolated._worker_environments(None) == [{}]
    assert isolated._worker_environments((0, 1)) == [{"CUDA_VISIBLE_DEVICES": "0"},
                                                      {"CUDA_VISIBLE_DEVICES": "1"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert isolated._worker_environments((1,)) == [{"CUDA_VISIBLE_DEVICES": "3"}]


def test_the_idle_time_of_two_gpus_counts_both():
    split = TimeSplit(gpus=2, started=0.0, ended=10.0)
    split.add(verify_s=3.0, timing_s=5.0)
    split.add(timing_s=4.0, compile_wait_s=1.0)
    assert (split.verify_s, split.timing_s, split.compile_wait_s) == (3.0, 9.0, 1.0)
    assert split.gpu_idle_s == 20.0 - 12.0
