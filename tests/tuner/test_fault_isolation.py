"""A whole tuning run over a kernel whose points fail in every way, on the CPU: the points are
really compiled (for sm_90a) by the compile pool, and a fake GPU worker, a real supervised
process, hangs, loses its "CUDA context" or fails verification as the real one would."""

from __future__ import annotations

import json
import time

import pytest

from cutetune.device.funnel import make_plan
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.results_db import Database, quarantined_points, trials_frame, winners
from cutetune.tuner.isolated import GPU_WORKER, SLOWDOWN_ALLOWED, trial_gpu_seconds
from cutetune.tuner.model_run import FAILED, NO_WINNER, STORED, TUNED
from testkit.fault_kernel import FAULTS, KERNEL, FaultConfig, FaultProblem, fake_us, measured_log
from testkit.fault_run import TRIAL_TIMEOUT_S, fault_workers, run

WINNER = FaultConfig("ok", 1)


def behaviours(tokens: int, log) -> list[str]:
    return sorted(json.loads(config)["behaviour"] for _, t, config in log if t == tokens)


def hang_deadline_s(tokens: int, trial_timeout_s: float = TRIAL_TIMEOUT_S) -> float:
    """The watchdog's deadline for the spinning point at `tokens` (as IsolatedTrialRunner
    computes it, from the ceilings the fake worker reports)."""
    spec = DEVICE_SPECS["H200"]
    ceilings = Ceilings.from_measured(spec, {"copy_gbps": 4000.0, "launch_floor_us": 2.0})
    plan = make_plan(KERNEL, FaultProblem(num_tokens=tokens), spec, ceilings)
    predicted = {p.config: p.prediction.predicted_us for p in plan.kept + plan.pruned}
    return trial_timeout_s + SLOWDOWN_ALLOWED * trial_gpu_seconds(
        predicted[FaultConfig("spin", 1)])


def test_every_fault_is_recorded_with_its_reason_and_the_run_goes_on(tmp_path):
    url, cache = f"sqlite:///{tmp_path / 'faults.db'}", tmp_path / "cache"
    started = time.monotonic()
    workers = fault_workers(cache)
    (row,) = run(url, cache, budget=16, buckets=[64], workers=workers)
    took = time.monotonic() - started

    assert row.status == TUNED and json.loads(row.winner_json) == {"behaviour": "ok",
                                                                    "passes": 1}
    assert (row.trials, row.failures) == (9, 5)  # every point of the space, five faulty
    assert row.median_us == pytest.approx(fake_us(WINNER, 64) - 0.5)  # the re-measurement
    assert row.speedup == pytest.approx((fake_us(FaultConfig("ok", 4), 64) - 0.5)
                                        / row.median_us)
    db = Database.open(url)
    frame = trials_frame(db, "fault_injection")
    reasons = {json.loads(c)["behaviour"]: r for c, r in zip(frame["config_json"],
                                                            frame["failure_reason"], strict=True)}
    for behaviour, prefix in FAULTS.items():
        assert reasons[behaviour].startswith(prefix), (behaviour, reasons[behaviour])
    assert "injected compile failure" in reasons["compile_error"]
    assert reasons["trap"] == "cuda: unspecified launch failure"
    slow = frame[frame["config_json"].str.contains('"slow"')]
    assert slow["status"].tolist() == ["ok"] and slow["median_us"].item() > row.median_us
    quarantined = {json.loads(p.config_json)["behaviour"]: p.reason
                   for _, p in quarantined_points(db, kernel_name="fault_injection")}
    assert set(quarantined) == {"trap", "spin"}
    # The worker died twice (a hang, a lost context) and was replaced each time; the run took
    # the hang's deadline plus process start-ups, not the hour the spinning point sleeps.
    assert workers.split.workers_lost == 2
    assert took < hang_deadline_s(64) + 120
    # The compile-failing point never reached the GPU worker; the others did, once each.
    log = measured_log(cache)
    assert behaviours(64, log) == sorted(["ok"] * 3 + ["wrong", "nan", "trap", "spin", "slow"])
    assert len({pid for pid, _, _ in log}) == 3

    # A second run: bucket 64 is stored and skipped; at bucket 128 the quarantined points are
    # not tried.
    summaries = run(url, cache, budget=16, buckets=[64, 128])
    assert [(s.bucket, s.status) for s in summaries] == [(64, STORED), (128, TUNED)]
    log = measured_log(cache)
    assert behaviours(64, log).count("ok") == 3
    assert behaviours(128, log) == sorted(["ok"] * 3 + ["wrong", "nan", "slow"])
    assert summaries[1].trials == 7

    # Nothing left to do: no point is timed again.
    again = run(url, cache, budget=16, buckets=[64, 128])
    assert [s.status for s in again] == [STORED, STORED]
    assert measured_log(cache) == log

    # --retry-failed: the quarantined points are tried again (and quarantined again).
    (retried,) = run(url, cache, budget=16, buckets=[256], retry_failed=True)
    assert "trap" in behaviours(256, measured_log(cache))
    assert "spin" in behaviours(256, measured_log(cache))
    assert retried.trials == 9
    assert {json.loads(p.config_json)["behaviour"] for _, p in
            quarantined_points(db, kernel_name="fault_injection")} == {"trap", "spin"}


def test_a_bucket_where_every_point_fails_is_stored_without_a_winner(tmp_path):
    url, cache = f"sqlite:///{tmp_path / 'faults.db'}", tmp_path / "cache"
    workers = fault_workers(cache, gpu_worker="testkit.fault_kernel:EveryPointWrong")
    (row,) = run(url, cache, budget=3, buckets=[8], workers=workers)
    assert row.status == NO_WINNER and row.trials == 3 and row.failures == 3
    assert row.winner_json is None and "wrong result" in row.note


def test_a_bucket_whose_finalists_hang_is_not_stored_and_resumes_next_run(tmp_path):
    url, cache = f"sqlite:///{tmp_path / 'faults.db'}", tmp_path / "cache"
    workers = fault_workers(cache, gpu_worker="testkit.fault_kernel:RemeasureHangs")
    (failed,) = run(url, cache, budget=3, buckets=[8], workers=workers)
    assert failed.status == FAILED and failed.note.startswith("re-measuring the finalists: hang")
    assert winners(Database.open(url), kernel_name="fault_injection") == []
    measured = measured_log(cache)
    (resumed,) = run(url, cache, budget=3, buckets=[8])
    assert resumed.status == TUNED and resumed.note == "resumed 3 trials"
    assert measured_log(cache) == measured  # the three points were not timed again


@pytest.mark.gpu
def test_the_gpu_worker_survives_every_fault_on_the_device(tmp_path):
    """The same run with the real GPU worker: a real trap, a kernel that spins forever."""
    url, cache = f"sqlite:///{tmp_path / 'faults.db'}", tmp_path / "cache"
    started = time.monotonic()
    workers = fault_workers(cache, gpu_worker=GPU_WORKER, trial_timeout_s=10.0)
    (row,) = run(url, cache, budget=16, buckets=[64], workers=workers)
    took = time.monotonic() - started
    assert row.status == TUNED and json.loads(row.winner_json) == {"behaviour": "ok",
                                                                    "passes": 1}
    assert (row.trials, row.failures) == (9, 5)
    frame = trials_frame(Database.open(url), "fault_injection")
    by_behaviour = {json.loads(c)["behaviour"]: (r, us) for c, r, us in zip(
        frame["config_json"], frame["failure_reason"], frame["median_us"], strict=True)}
    for behaviour, prefix in FAULTS.items():
        assert by_behaviour[behaviour][0].startswith(prefix), by_behaviour[behaviour]
    assert by_behaviour["slow"][1] > 2 * row.median_us
    assert workers.split.workers_lost == 2
    assert took < hang_deadline_s(64, 10.0) + 180
