"""Fresh runs replayed from an exhaustive CSV (issue 38 item 1 on the CPU), on a space whose
answer is known: rmsnorm's points of qwen3-8b timed by a known cost model."""

from __future__ import annotations

import lzma
import sys

import pytest

from benchmarks.fresh_run_replay import main
from testkit.known_exhaustive import write_known_exhaustive


def run(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["fresh_run_replay", *args])
    main()
    return capsys.readouterr().out


@pytest.mark.parametrize("flags", [(), ("--incumbent",), ("--lend", "--incumbent")])
def test_runs_without_noise_name_one_winner_in_every_bucket(tmp_path, monkeypatch, capsys,
                                                            flags):
    path = write_known_exhaustive(tmp_path / "exhaustive.csv", ("qwen3-8b",), ["rmsnorm"],
                                  (8, 4096), leave_out_last=True)
    out = run(monkeypatch, capsys, str(path), "--runs", "2", "--models", "qwen3-8b",
              "--drift-pct", "0", "--jitter-pct", "0", *flags)
    # qwen3-8b's two norms (plain and with the add) at two buckets, the last one measured in
    # part and left out.
    assert "left out, not every valid point measured: 1 buckets" in out
    assert "| all | 3 | 3 (100%) | 0.00% | 0.00% | 0.00% |" in out
    assert "| rmsnorm | 3 | 3 (100%) | 0.00% | 0.00% | 0.00% |" in out


def test_an_xz_csv_of_another_device_replays_like_the_plain_one(tmp_path, monkeypatch, capsys):
    path = write_known_exhaustive(tmp_path / "exhaustive.csv", ("qwen3-8b",), ["rmsnorm"],
                                  (8, 4096))
    packed = tmp_path / "exhaustive.csv.xz"
    packed.write_bytes(lzma.compress(path.read_bytes()))
    args = ("--runs", "2", "--models", "qwen3-8b", "--drift-pct", "0", "--jitter-pct", "0",
            "--device", "H100 SXM")
    out = run(monkeypatch, capsys, str(packed), *args)
    assert "| all | 4 | 4 (100%) | 0.00% | 0.00% | 0.00% |" in out
    assert out == run(monkeypatch, capsys, str(path), *args)
    # The whole budget on the ranked points: the plans keep more points than the budget (16
    # trials of 33-39 kept), so the runs try other points than TPE's, and agree without noise.
    assert "| all | 4 | 4 (100%) |" in run(monkeypatch, capsys, str(packed), *args,
                                          "--warm-start-share", "1")
    # Both norms are qwen3-8b's own problems, and a run lends among none of its own: lending
    # changes nothing.
    assert run(monkeypatch, capsys, str(packed), *args, "--lend") == out


def test_a_csv_without_the_models_buckets_is_refused(tmp_path, monkeypatch, capsys):
    path = write_known_exhaustive(tmp_path / "exhaustive.csv", ("qwen3-8b",), ["rmsnorm"],
                                  (8,))
    with pytest.raises(SystemExit, match="no bucket of llama-3.1-8b measured in full"):
        run(monkeypatch, capsys, str(path), "--models", "llama-3.1-8b")


@pytest.mark.parametrize("args, message", [
    (("--runs", "0"), "--runs must be at least 1, got 0"),
    (("--drift-pct", "-1"), "--drift-pct must be a percentage from 0 to below 100, got -1.0"),
    (("--tie-band", "nan"), "--tie-band must be a percentage from 0 to below 100, got nan"),
    (("--warm-start-share", "0"), "--warm-start-share must be at least 1, got 0"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    with pytest.raises(SystemExit):
        run(monkeypatch, capsys, str(tmp_path / "absent.csv"), *args)
    assert message in capsys.readouterr().err
