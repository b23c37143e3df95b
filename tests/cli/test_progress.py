"""What `cutetune tune` prints: the progress lines, the summary table, the time split."""

from __future__ import annotations

import io

from cutetune.cli.progress import RunProgress, summary_table, time_split_line
from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model
from cutetune.tuner.isolated import TimeSplit
from cutetune.tuner.model_run import NO_WINNER, STORED, TUNED, BucketSummary
from testkit.fake_qk_runner import CEILINGS, FINGERPRINT

PROBLEM = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
WINNER = '{"heads_per_warp": 2, "vector_bits": 128, "warps_per_block": 4}'
ROWS = [
    BucketSummary("qk_norm", PROBLEM, 1, TUNED, WINNER, 1.234, 41.5, 1.087, 16, 2),
    BucketSummary("qk_norm", PROBLEM, 2, STORED, WINNER, 1.3, 40.0, None, 16, 0,
                  "stored earlier"),
    BucketSummary("qk_norm", PROBLEM, 4, NO_WINNER, None, None, None, None, 3, 3,
                  "first failure: wrong result: q"),
]


def test_the_summary_has_a_row_per_bucket_with_its_numbers():
    header, *lines = summary_table(ROWS).splitlines()
    assert header.split()[:5] == ["kernel", "problem", "tokens", "status", "us"]
    assert len(lines) == 3
    assert "1.23" in lines[0] and "41.5" in lines[0] and "1.09x" in lines[0]
    assert "warps_per_block=4" in lines[0] and "heads_per_warp=2" in lines[0]
    assert "stored" in lines[1] and "1.09x" not in lines[1]
    assert "no winner (first failure: wrong result: q)" in lines[2]
    assert all(line.startswith("qk_norm  dtype=bfloat16 head_dim=128") for line in lines)


def test_progress_on_a_log_prints_a_line_per_bucket_not_per_trial():
    stream = io.StringIO()
    progress = RunProgress(stream)
    progress.started(FINGERPRINT, CEILINGS, [], 5)
    progress.bucket_finished(ROWS[0])
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("NVIDIA H200 (132 SMs): copy ceiling 4320 GB/s")
    assert "0 buckets to tune" in lines[0] and "5 stored already" in lines[0]
    assert "qk_norm dtype=bfloat16" in lines[1] and "1 tokens: 1.23 us, 16 trials, 2 failed" \
        in lines[1]


def test_the_time_split_names_every_part():
    split = TimeSplit(verify_s=10.0, timing_s=200.0, compile_wait_s=4.0, compile_cpu_s=150.0,
                      workers_lost=1, started=0.0, ended=300.0)
    line = time_split_line(split, 12)
    assert line == ("time: 5m00s wall; the GPU worker verified for 10 s, timed for 200 s and "
                    "was idle for 90 s (4 s of it waiting for compiles); compiles took 150 s "
                    "of CPU in 12 processes; 1 workers lost")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_buckets_in_hand_at_once_count_their_own_trials():
    from types import SimpleNamespace

    stream = Terminal()
    progress = RunProgress(stream)
    progress.started(FINGERPRINT, CEILINGS, [SimpleNamespace(trials=3)] * 2, 0)
    one, two = (SimpleNamespace(kernel=qk.KERNEL, problem=PROBLEM.with_tokens(b), bucket=b)
                for b in (1, 2))
    progress.bucket_started(one, 3)
    progress.bucket_started(two, 3)
    for planned in (one, two, two):
        progress.trial(planned, None, None)
    status = stream.getvalue().split("\r")[-1]
    assert "2 tokens: trial 2 of 3" in status and status.startswith("[3/6 trials")
    progress.bucket_finished(ROWS[0])  # bucket 1 ends; bucket 2 goes on
    progress.trial(two, None, None)
    assert "2 tokens: trial 3 of 3" in stream.getvalue().split("\r")[-1]


def test_the_time_split_of_two_gpus_sums_their_workers():
    split = TimeSplit(gpus=2, verify_s=10.0, timing_s=400.0, compile_wait_s=4.0,
                      compile_cpu_s=150.0, started=0.0, ended=300.0)
    assert time_split_line(split, 12).startswith(
        "time: 5m00s wall; the 2 GPU workers (summed) verified for 10 s, timed for 400 s and "
        "were idle for 190 s")


class FixedEta:
    """A run's ETA (tuner/eta.py) that says what the test sets."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def remaining_s(self) -> float:
        return self.seconds


def test_the_status_line_shows_the_runs_eta_not_a_rate_of_trials():
    from types import SimpleNamespace

    stream = Terminal()
    progress = RunProgress(stream)
    eta = FixedEta(3725.0)
    progress.started(FINGERPRINT, CEILINGS, [SimpleNamespace(trials=100)], 0, eta)
    assert stream.getvalue().split("\r")[-1].startswith("[0/100 trials, ETA 62m05s]")
    planned = SimpleNamespace(kernel=qk.KERNEL, problem=PROBLEM.with_tokens(1), bucket=1)
    progress.bucket_started(planned, 16)
    eta.seconds = 95.0  # a trial later the run knows better; 1 trial of 100 says nothing
    progress.trial(planned, None, None)
    assert stream.getvalue().split("\r")[-1].startswith("[1/100 trials, ETA 1m35s]")
    assert progress.eta_s() == 95.0
    eta.seconds = 7.0
    progress.bucket_finished(ROWS[0])
    finished = [line for line in stream.getvalue().replace("\r", "\n").splitlines()
                if "1 tokens: 1.23 us" in line]
    assert finished and "[1/100 trials, ETA 7s] qk_norm" in finished[0]
