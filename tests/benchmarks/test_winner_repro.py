"""benchmarks/winner_repro.py: each run's buckets read from its database, the runs compared per
bucket (synthetic run outputs: test inputs, not measurements), resumable runs within a time
budget, and the table BENCHMARKS.md shows."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from benchmarks import benchmarks_md as generator
from benchmarks import winner_repro
from cutetune.kernels import qk_norm as qk
from cutetune.results_db import Database, copy_results, winners
from cutetune.spaces.models import load_model
from cutetune.tuner.finals import TIE_BAND_FLOOR
from cutetune.tuner.tune import plan_bucket, tune_bucket
from testkit.child_process import child_env
from testkit.fake_qk_runner import CEILINGS, FINGERPRINT, SPEC, FakeRunner

A, B, C = ('{"warps": 1}', '{"warps": 2}', '{"warps": 4}')
BAND = 0.02


def bucket_rows(run: int, bucket: int, winner: str, finalists: dict, trials: dict | None = None,
                model: str = "m", band: float = BAND) -> list[dict]:
    """One run's rows of one bucket, as run_rows writes them."""
    base = {"model": model, "run": run, "kernel": "k", "problem": "hidden=7", "bucket": bucket,
            "tie_band": band, "winner": winner}
    rows = [{**base, "kind": "winner", "config": winner,
             "median_us": finalists.get(winner, math.nan), "iqr_us": 0.01}]
    rows += [{**base, "kind": "finalist", "config": c, "median_us": us, "iqr_us": 0.01}
             for c, us in finalists.items()]
    rows += [{**base, "kind": "trial", "config": c, "median_us": us, "iqr_us": 0.01}
             for c, us in (trials or finalists).items()]
    return rows


def synthetic_runs() -> pd.DataFrame:
    rows = []
    for run in range(1, 6):
        # Bucket 1: the same winner in every run.
        rows += bucket_rows(run, 1, A, {A: 1.0, B: 1.05})
        # Bucket 8: run 5 names B; in the others B is 3% slower than A side by side (band
        # 2%): beyond.
        rows += bucket_rows(run, 8, B if run == 5 else A,
                            {A: 1.03, B: 1.0} if run == 5 else {A: 1.0, B: 1.03})
        # Bucket 64: run 2 names C, and A is 5% slower there: beyond the band.
        rows += bucket_rows(run, 64, C if run == 2 else A,
                            {C: 1.0, A: 1.05} if run == 2 else {A: 1.0, C: 1.04})
        # Bucket 512: run 3 names B; neither winner was a finalist in the other's runs, and
        # by search times the other is at most 1.5% slower: within.
        rows += bucket_rows(run, 512, B if run == 3 else A, {B: 2.0} if run == 3 else {A: 2.0},
                            trials={B: 2.0, A: 2.03} if run == 3 else {A: 2.0, B: 2.02})
    return pd.DataFrame(rows, columns=list(winner_repro.RUN_COLUMNS))


def test_the_comparison_counts_same_winners_and_measures_each_difference_in_its_run():
    frame = winner_repro.compare(synthetic_runs()).set_index("bucket")
    assert list(frame.index) == [1, 8, 64, 512]
    assert frame["runs"].tolist() == [5, 5, 5, 5]
    assert frame["same_winner"].tolist() == [True, False, False, False]
    assert frame["winners"].tolist() == [1, 2, 2, 2]
    assert frame.loc[1, "modal_winner"] == A and frame.loc[1, "modal_runs"] == 5
    assert math.isnan(frame.loc[1, "gap_pct"]) and frame.loc[1, "gap_measured"] == ""
    # Where they differ: the case furthest beyond its band, over every run and every other
    # run's winner, measured in that run.
    assert frame.loc[8, "gap_pct"] == pytest.approx(3.0)
    assert not frame.loc[8, "within_band"]
    assert frame.loc[64, "gap_pct"] == pytest.approx(5.0)
    assert frame.loc[64, "gap_measured"] == "side by side" and not frame.loc[64, "within_band"]
    assert frame.loc[512, "gap_pct"] == pytest.approx(1.5)
    assert frame.loc[512, "gap_measured"] == "search times" and frame.loc[512, "within_band"]
    assert frame.loc[512, "band_pct"] == pytest.approx(2.0)


def test_a_difference_within_the_band_in_every_run_is_within():
    rows = []
    for run in range(1, 6):
        winner = B if run in (2, 4) else A
        rows += bucket_rows(run, 8, winner, {A: 1.0, B: 1.01} if winner == A else
                            {B: 1.0, A: 1.012})
    (row,) = winner_repro.compare(pd.DataFrame(rows)).itertuples()
    assert not row.same_winner and row.within_band
    assert row.gap_pct == pytest.approx(1.2) and row.band_pct == pytest.approx(2.0)
    assert row.modal_winner == A and row.modal_runs == 3


def test_a_winner_another_run_never_timed_is_beyond_the_band():
    rows = bucket_rows(1, 8, A, {A: 1.0}) + bucket_rows(2, 8, B, {B: 1.0})
    (row,) = winner_repro.compare(pd.DataFrame(rows)).itertuples()
    assert math.isinf(row.gap_pct) and not row.within_band and row.gap_measured == "not timed"


def test_run_rows_reads_each_buckets_winner_finalists_and_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    db = Database.open(url)
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    for tokens in (1, 64):
        tune_bucket(plan_bucket(qk.KERNEL, static, tokens, SPEC, CEILINGS), FakeRunner(), db,
                    FINGERPRINT, budget=6)
    stored = {w.bucket: w for w in winners(db, FINGERPRINT, "qk_norm")}
    db.dispose()
    rows = winner_repro.run_rows(url, "qwen3-8b", 3)
    assert set(rows["bucket"]) == {1, 64} and set(rows["run"]) == {3}
    for bucket, group in rows.groupby("bucket"):
        (winner,) = group[group["kind"] == "winner"].itertuples()
        assert json.loads(winner.config) == json.loads(stored[bucket].config_json)
        assert winner.median_us == pytest.approx(stored[bucket].median_us)
        assert winner.tie_band == pytest.approx(TIE_BAND_FLOOR)
        finalists = group[group["kind"] == "finalist"]
        assert len(finalists) >= 2 and winner.config in set(finalists["config"])
        assert 1 <= (group["kind"] == "trial").sum() <= 6
    assert rows["problem"].iloc[0].startswith("dtype=bfloat16 ")


def test_run_rows_of_an_exported_database_read_its_stored_winners(tmp_path):
    """A run copied out by `cutetune export --format db` has no Optuna studies: each bucket's
    winner is the stored one, its own finalist with its stored times, in the default band."""
    source_url = f"sqlite:///{tmp_path / 'run.db'}"
    source = Database.open(source_url)
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    tune_bucket(plan_bucket(qk.KERNEL, static, 8, SPEC, CEILINGS), FakeRunner(), source,
                FINGERPRINT, budget=6)
    (stored,) = winners(source, FINGERPRINT, "qk_norm")
    exported_url = f"sqlite:///{tmp_path / 'exported.db'}"
    exported = Database.open(exported_url)
    copy_results(source, exported)
    source.dispose()
    exported.dispose()
    rows = winner_repro.run_rows(exported_url, "qwen3-8b", 1)
    (winner,) = rows[rows["kind"] == "winner"].itertuples()
    assert json.loads(winner.config) == json.loads(stored.config_json)
    assert winner.median_us == pytest.approx(stored.median_us)
    assert winner.tie_band == pytest.approx(TIE_BAND_FLOOR)
    assert list(rows[rows["kind"] == "finalist"]["config"]) == [winner.config]
    assert 1 <= (rows["kind"] == "trial").sum() <= 6


def test_runs_resume_and_stop_within_the_budget(tmp_path, monkeypatch):
    """A stand-in for `cutetune tune`: each 'run' tunes two buckets with the fake runner."""
    tuned = []

    def fake_tune_once(model, run, tokens, state):
        db = Database.open(f"sqlite:///{state / f'{model}-run{run}.db'}")
        static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
        for n in tokens:
            tune_bucket(plan_bucket(qk.KERNEL, static, n, SPEC, CEILINGS), FakeRunner(), db,
                        FINGERPRINT, budget=3)
        db.dispose()
        tuned.append((model, run))
        return 100.0

    monkeypatch.setattr(winner_repro, "tune_once", fake_tune_once)
    state, out = tmp_path / "state", tmp_path / "out"
    # The first run takes "100 s": with 50 s of budget no second one starts.
    winner_repro.run_all(["a", "b"], [1, 2], [1, 8], state, out, budget_s=50)
    assert tuned == [("a", 1)] and sorted(p.name for p in out.iterdir()) == ["a-run1.csv"]
    # The same command continues; a run done before (its CSV in OUT or STATE) is skipped.
    shutil.rmtree(out)
    winner_repro.run_all(["a", "b"], [1, 2], [1, 8], state, out, budget_s=1000)
    assert tuned == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert sorted(p.name for p in out.iterdir()) == ["a-run2.csv", "b-run1.csv", "b-run2.csv"]
    # The comparison of the four runs, from the command line.
    paths = sorted(state.glob("*-run*.csv"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.winner_repro", "compare", *paths,
                           "--out", tmp_path / "compare.csv"], env=child_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(tmp_path / "compare.csv")
    assert set(frame["model"]) == {"a", "b"} and set(frame["runs"]) == {2}
    assert "| model | runs | buckets | same winner |" in done.stdout


def test_benchmarks_md_compares_the_runs_of_a_listed_folder(tmp_path, monkeypatch):
    assert ("winner_repro" in set(generator.read_index()["kind"])) == (
        "## Winners of fresh runs" in generator.benchmarks_md())
    copy = tmp_path / "results"
    shutil.copytree(generator.RESULTS, copy)
    monkeypatch.setattr(generator, "RESULTS", copy)
    # A listed folder of the runs' CSVs, as `winner_repro run --out` writes them.
    folder = copy / "winner-repro-abc1234"
    folder.mkdir()
    for (model, run), rows in synthetic_runs().groupby(["model", "run"]):
        rows.to_csv(folder / f"{winner_repro.run_name(model, run)}.csv", index=False)
    with (copy / "index.csv").open("a") as index:
        index.write("winner-repro-abc1234,winner_repro,abc1234,2026-12-04,one H200,"
                    "python3 -m benchmarks.winner_repro run --out F\n")
    text = generator.benchmarks_md()
    assert "## Winners of fresh runs" in text
    assert "| m | 5 | 4 | **1 (25%)** | 1 | 2 |" in text
    assert "| m | k | hidden=7 | 64 | 2 (4 of 5) | 5.00% | 2.00% | side by side |" in text


def test_two_files_holding_the_same_run_are_refused(tmp_path):
    frame = pd.DataFrame(bucket_rows(1, 1, A, {A: 1.0, B: 1.05}),
                         columns=list(winner_repro.RUN_COLUMNS))
    first, second = tmp_path / "m-run1.csv", tmp_path / "m-run2.csv"
    frame.to_csv(first, index=False)
    frame.to_csv(second, index=False)  # renamed, but its rows still say run 1
    with pytest.raises(SystemExit, match="both hold run 1 of m: each run must be in one file"):
        winner_repro.compare_files([first, second])
