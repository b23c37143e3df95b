"""benchmarks/tune_and_bench.sh, run with a stand-in `python3` that records each command: kernel
by kernel (its tunes, then its benches), every step once across calls, none started without the
time it needs, and a failed step left for the next call."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "tune_and_bench.sh"
# Records its arguments; fails the command whose arguments contain $FAIL_ON.
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in *"$FAIL_ON"*) [ -n "$FAIL_ON" ] && exit 3;; esac
exit 0
"""
UNITS = ("rope:qwen3-8b,deepseek-v3:qwen3-8b", "nvfp4_quant:tests/data/x/M.json:")
ROPE_Q8, ROPE_DS = "tune rope --model qwen3-8b", "tune rope --model deepseek-v3"
BENCH_Q8, NVFP4 = "bench rope --model qwen3-8b", "tune nvfp4_quant --model tests/data/x/M.json"


def run(tmp_path: Path, **env: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.unlink(missing_ok=True)
    subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *UNITS], check=True,
                   capture_output=True, text=True,
                   env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                        "CALLS": str(calls), "FAIL_ON": "", **env})
    # "VERB KERNEL --model MODEL" of each command.
    return [" ".join(line.split()[4:8]) for line in calls.read_text().splitlines()] \
        if calls.exists() else []


def done(tmp_path: Path) -> list[str]:
    return (tmp_path / "out" / "done.txt").read_text().split()


def test_each_kernel_is_tuned_then_benched_and_a_second_call_runs_nothing(tmp_path):
    assert run(tmp_path) == [ROPE_Q8, ROPE_DS, BENCH_Q8, NVFP4]
    assert done(tmp_path) == ["tune-qwen3-8b-rope", "tune-deepseek-v3-rope",
                              "bench-qwen3-8b-rope", "tune-M-nvfp4_quant"]
    assert run(tmp_path) == []
    # FULL=1: every pair again at every bucket, the steps done before skipped.
    assert run(tmp_path, FULL="1") == [ROPE_Q8, ROPE_DS, NVFP4]
    assert done(tmp_path)[4:] == ["full-qwen3-8b-rope", "full-deepseek-v3-rope",
                                  "full-M-nvfp4_quant"]


def test_no_step_starts_without_its_time_and_the_next_call_goes_on(tmp_path):
    # 50 s: enough for a tune (40 s), not for a bench (60 s).
    assert run(tmp_path, DEADLINE_S="50") == [ROPE_Q8, ROPE_DS]
    assert run(tmp_path) == [BENCH_Q8, NVFP4]


def test_a_failed_step_is_not_recorded_and_the_run_goes_on(tmp_path):
    assert run(tmp_path, FAIL_ON="deepseek-v3") == [ROPE_Q8, ROPE_DS, BENCH_Q8, NVFP4]
    assert "tune-deepseek-v3-rope" not in done(tmp_path)
    assert run(tmp_path) == [ROPE_DS]
    assert (tmp_path / "out" / "tune-deepseek-v3-rope.txt").exists()
