"""Fresh runs replayed from an exhaustive CSV (issue 38 item 1 on the CPU), on a space whose
answer is known: rmsnorm's points of qwen3-8b timed by a known cost model."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from benchmarks.exhaustive import COLUMNS, work
from benchmarks.fresh_run_replay import main
from cutetune.device.specs import DEVICE_SPECS
from cutetune.spaces.space import config_to_json
from testkit.known_cost_model import KNOWN

SPEC = DEVICE_SPECS["H200"]


def write_exhaustive(path: Path, tokens: tuple[int, ...], skip_last: bool = False) -> Path:
    rows = list(work(("qwen3-8b",), ["rmsnorm"], tokens, SPEC))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for model, kernel, problem, config in rows[:-1] if skip_last else rows:
            writer.writerow({"model": model, "kernel_name": kernel.name,
                             "static_key": problem.static_key(), "bucket": problem.num_tokens,
                             "config_json": config_to_json(config), "status": "ok",
                             "median_us": KNOWN.predict_us(kernel.cost(problem, config, SPEC),
                                                           SPEC),
                             "iqr_us": 0.01, "failure_reason": ""})
    return path


def run(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["fresh_run_replay", *args])
    main()
    return capsys.readouterr().out


def test_runs_without_noise_name_one_winner_in_every_bucket(tmp_path, monkeypatch, capsys):
    path = write_exhaustive(tmp_path / "exhaustive.csv", (8, 4096), skip_last=True)
    out = run(monkeypatch, capsys, str(path), "--runs", "2", "--models", "qwen3-8b",
              "--drift-pct", "0", "--jitter-pct", "0")
    # qwen3-8b's two norms (plain and with the add) at two buckets, the last one measured in
    # part and left out.
    assert "left out, not every valid point measured: 1 buckets" in out
    assert "| all | 3 | 3 (100%) | 0.00% |" in out
    assert "| rmsnorm | 3 | 3 (100%) | 0.00% |" in out


def test_a_csv_without_the_models_buckets_is_refused(tmp_path, monkeypatch, capsys):
    path = write_exhaustive(tmp_path / "exhaustive.csv", (8,))
    with pytest.raises(SystemExit, match="no bucket of llama-3.1-8b measured in full"):
        run(monkeypatch, capsys, str(path), "--models", "llama-3.1-8b")
