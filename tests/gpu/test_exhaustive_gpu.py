"""benchmarks.exhaustive on the GPU (issue 42 item 2): every valid point of a small problem
measured once, one row each, and the same command again measures nothing new."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.exhaustive import work
from cutetune.device.specs import DEVICE_SPECS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
ARGS = ("--models", "qwen3-0.6b", "--kernels", "qk_norm", "--tokens", "1,64")


def run(out: Path, state: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "benchmarks.exhaustive", "--out", str(out),
                           "--state", str(state), *ARGS], cwd=ROOT, capture_output=True,
                          text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_point_is_measured_once_and_a_second_call_adds_none(tmp_path):
    out, state = tmp_path / "exhaustive.csv", tmp_path / "state"
    first = run(out, state)
    expected = list(work(["qwen3-0.6b"], ["qk_norm"], (1, 64), DEVICE_SPECS["H200"]))
    assert f"{len(expected)} left" in first.splitlines()[0]
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(expected)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= len(rows) - 2, [r["failure_reason"] for r in rows if r not in ok]
    assert all(0.5 < float(r["median_us"]) < 100 for r in ok)
    second = run(out, state)
    assert second.splitlines()[0] == f"{len(rows)} points stored, 0 left"
    with out.open() as f:
        assert sum(1 for _ in csv.DictReader(f)) == len(rows)
