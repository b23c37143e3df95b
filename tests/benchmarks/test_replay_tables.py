"""The replay tables from an exhaustive CSV (issue 42 items 2, 3 and 6), on a space whose answer
is known: rmsnorm's points of three presets and of one held-out model (Qwen2.5-7B, hidden 3584,
which no preset has), every one timed by a known cost model (grid barriers none: rmsnorm has
none). Fitted on the presets, the model
is recovered, so the calibrated replay loses nothing and its top pick is the best everywhere,
held-out buckets included."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.benchmarks_md import exhaustive_table
from benchmarks.exhaustive import COLUMNS, HELD_OUT, done_keys, models_of, row_key
from benchmarks.replay_tables import markdown_lines, tables
from cutetune.spaces.models import PRESET_NAMES
from testkit.known_exhaustive import write_known_exhaustive

MODELS = ("qwen3-0.6b", "qwen3-8b", "llama-3.1-70b", "tests/data/hf_configs/"
          "Qwen2.5-7B-Instruct.json")


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory) -> Path:
    return write_known_exhaustive(tmp_path_factory.mktemp("replay") / "exhaustive.csv",
                                  MODELS, ["rmsnorm"], (8, 4096))


def test_work_lists_each_problem_once_and_done_keys_read_back(exhaustive):
    with exhaustive.open() as f:
        rows = list(csv.DictReader(f))
    keys = done_keys(exhaustive)
    assert len(keys) == len(rows)  # no point twice, though qwen3-8b and others share problems
    first = rows[0]
    assert row_key(first["kernel_name"], first["static_key"], first["bucket"],
                   first["config_json"]) in keys
    assert models_of("presets") == PRESET_NAMES and models_of("held-out") == HELD_OUT
    assert models_of("qwen3-8b,llama-3.1-8b") == ("qwen3-8b", "llama-3.1-8b")


def test_tables_recover_the_known_model_and_score_it(exhaustive, tmp_path, monkeypatch):
    # Exact times: no band is needed, and without one the top pick is the best prediction.
    monkeypatch.setattr("cutetune.device.calibration_fit.PRUNE_FACTOR_FLOOR", 1.0)
    monkeypatch.setattr("cutetune.device.knob_fit.PRUNE_FACTOR_FLOOR", 1.0)
    rows = {(r["cost_model"], r["scope"], r["kernel"]): r for r in tables(exhaustive)}
    left_out = "presets, own problem not fitted"
    assert set(rows) == {(m, s, k) for m, s in (("datasheet", "presets"),
                                                ("calibrated", "presets"),
                                                ("calibrated", left_out),
                                                ("calibrated", "held-out"))
                         for k in ("all", "rmsnorm")}
    # Fitted without its own trials, each problem is still planned by the exact model.
    assert rows[("calibrated", left_out, "all")]["buckets"] == 3 * 2 * 2
    assert rows[("calibrated", left_out, "all")]["max_regret_pct"] == pytest.approx(0.0,
                                                                                   abs=1e-6)
    assert rows[("calibrated", left_out, "all")]["model_pick_within_3pct_share"] == 1.0
    calibrated = rows[("calibrated", "presets", "all")]
    # Three presets, each with a plain and a fused-add norm, at two buckets.
    assert calibrated["buckets"] == 3 * 2 * 2
    assert calibrated["max_regret_pct"] == pytest.approx(0.0, abs=1e-6)
    assert calibrated["model_pick_within_3pct_share"] == 1.0
    # The times follow the model exactly: ranked by it, the other problems' bests serving
    # borrows are within 3% everywhere; without a calibration, the nearest lender's is not.
    assert calibrated["zero_shot_within_3pct_share"] == 1.0
    assert rows[("datasheet", "presets", "all")]["zero_shot_within_3pct_share"] < 1.0
    assert "launch 1.10 us, wave 0.350 us" in calibrated["calibration"]
    # The exact model keeps only the best's ties; the datasheet's 2x band keeps all.
    assert calibrated["median_kept_pct"] < rows[("datasheet", "presets", "all")][
        "median_kept_pct"] == 100.0
    held_out = rows[("calibrated", "held-out", "all")]
    assert held_out["buckets"] == 2 * 2
    assert held_out["model_pick_within_3pct_share"] == 1.0
    assert held_out["calibration"] == "fitted on the presets only"

    out = tmp_path / "replay.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(calibrated))
        writer.writeheader()
        writer.writerows(rows.values())
    lines = markdown_lines(out)
    assert lines[0].startswith("| cost model | buckets of | kernel |")
    assert any(line.startswith("| calibrated | held-out | all | 4 |") for line in lines)
    with exhaustive.open() as f:
        points = sum(1 for _ in f) - 1
    assert exhaustive_table(exhaustive)[2] == f"| rmsnorm | 8 | {points} | 0 |"


def test_a_bucket_measured_in_part_is_left_out_and_counted(exhaustive, tmp_path, capsys):
    with exhaustive.open() as f:
        rows = list(csv.DictReader(f))
    partial = tmp_path / "partial.csv"
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows[1:])  # the first bucket lacks one point
    by_scope = {(r["cost_model"], r["scope"]): r["buckets"] for r in tables(partial)
                if r["kernel"] == "all"}
    assert by_scope[("calibrated", "presets")] == 3 * 2 * 2 - 1
    assert by_scope[("calibrated", "held-out")] == 2 * 2
    assert ("left out, not every valid point measured: 1 preset buckets, 0 held-out buckets"
            in capsys.readouterr().out)


def test_tables_read_the_measurements_of_several_calls_as_one(exhaustive, tmp_path):
    presets = write_known_exhaustive(tmp_path / "presets.csv", MODELS[:3], ["rmsnorm"], (8, 4096))
    held_out = write_known_exhaustive(tmp_path / "held-out.csv", MODELS[3:], ["rmsnorm"],
                                      (8, 4096))
    assert tables([presets, held_out]) == tables(exhaustive)
