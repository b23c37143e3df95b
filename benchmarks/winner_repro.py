"""Do fresh runs on one GPU name the same winners? (issue 38, item 1: the same winner in at least
95% of buckets, and where it differs, within the tie band.)

Step 1, on the GPU, one fresh run after another, resumable: each run is `cutetune tune --model M
--tokens 1,8,64,512,4096,32768` (every kernel M uses) into its own empty database, which holds
its Optuna studies too, so all a run starts from is the package's winners shipped for this GPU
(each problem's own the incumbent, the others lent: tuner/finals.py), as any run's; the runs
share one artifact cache, which only saves compiling. After a
run, its buckets are written to OUT/M-runK.csv: each bucket's winner and tie band, its
finalists as re-measured side by side (the study's finals), and every verified trial's search
time. A run cut short (the call's time limit) continues where it stopped when the same command
runs again while STATE is there; runs whose CSV is in OUT or STATE are skipped; no run starts
when the longest one so far would not fit in --budget-s.

    python3 -m benchmarks.winner_repro run --out OUT [--state DIR] [--models M,M]
        [--runs 1,2,3,4,5] [--tokens 1,8,...] [--budget-s 540]

A database tuned elsewhere (another URL, or a file `cutetune export --format db` wrote) gives
the same CSV:

    python3 -m benchmarks.winner_repro rows DB_URL --model M --run K --out OUT/M-runK.csv

Step 2, anywhere: compare the runs' CSVs per (model, kernel, problem, bucket) and write one row
each: how many runs named how many winners, and where they differ, the largest gap between the
winner of a run and another run's winner, measured in that run (side by side where both were
finalists, else by their search times), against that run's band.

    python3 -m benchmarks.winner_repro compare OUT/*-run*.csv --out \
        benchmarks/results/winner-repro-COMMIT.csv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

MODELS = ("qwen3-8b", "qwen3-30b-a3b")  # one dense and one MoE preset
TOKENS = (1, 8, 64, 512, 4096, 32768)
RUNS = (1, 2, 3, 4, 5)
TARGET_SAME_SHARE = 0.95
# Comparing a gap with a band: the CSV's decimals are not the tuner's.
SLACK = 1e-9

RUN_COLUMNS = ("model", "run", "kernel", "problem", "bucket", "tie_band", "winner", "kind",
               "config", "median_us", "iqr_us")
COMPARE_COLUMNS = ("model", "kernel", "problem", "bucket", "runs", "winners", "same_winner",
                   "modal_runs", "gap_pct", "band_pct", "within_band", "gap_measured",
                   "modal_winner")


# -- step 1: the runs --------------------------------------------------------------------------


def run_name(model: str, run: int) -> str:
    return f"{model}-run{run}"


def tune_once(model: str, run: int, tokens: Sequence[int], state: Path) -> float:
    """One fresh run (or the rest of one cut short) into STATE/M-runK.db; its wall time."""
    name = run_name(model, run)
    command = [sys.executable, "-m", "cutetune.cli.main", "--db",
               f"sqlite:///{state / f'{name}.db'}", "tune", "--model", model,
               "--tokens", ",".join(map(str, tokens))]
    log = state / f"{name}.log"
    start = time.monotonic()
    with log.open("a") as output:
        done = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT,
                              env={**os.environ, "CUTETUNE_CACHE_DIR": str(state / "cache")})
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{name}: cutetune tune failed ({done.returncode}):\n{tail}")
    return time.monotonic() - start


def problem_label(static_key: str) -> str:
    return " ".join(f"{k}={v}" for k, v in json.loads(static_key).items())


def run_rows(db_url: str, model: str, run: int) -> pd.DataFrame:
    """The buckets of one run's database: per bucket a `winner` row (its config and own
    re-measured times; no config where nothing verified), a `finalist` row per finalist as
    re-measured, and a `trial` row per verified trial with its search time (the winner's trial
    holds its re-measurement, as the database stores it). A database without the run's Optuna
    studies (one `cutetune export --format db` wrote carries cutetune's tables only) gives
    each bucket's stored winner as its one finalist (its stored re-measured times), with the
    default band."""
    import optuna

    from cutetune.results_db import Database, trials_frame, winners_frame
    from cutetune.tuner.finals import TIE_BAND_FLOOR
    from cutetune.tuner.study import FINALS_ATTR

    db = Database.open(db_url)
    try:
        trials = trials_frame(db)
        stored = {(w.kernel_name, w.static_key, int(w.bucket)): w
                  for w in winners_frame(db).itertuples()}
    finally:
        db.dispose()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    finals = {s.study_name: s.user_attrs.get(FINALS_ATTR)
              for s in optuna.get_all_study_summaries(db_url, include_best_trial=False)}
    keys = ["kernel_name", "static_key", "bucket"]
    latest = trials[trials["run_id"] == trials.groupby(keys)["run_id"].transform("max")]
    rows = []
    for (kernel, static_key, bucket), group in latest.groupby(keys, sort=True):
        final = finals.get(group["study_name"].iloc[0])
        if final is None and (kernel, static_key, int(bucket)) in stored:
            kept = stored[kernel, static_key, int(bucket)]
            final = {"tie_band": TIE_BAND_FLOOR, "winner": kept.config_json, "finalists": [
                {"config": kept.config_json, "median_us": kept.median_us,
                 "iqr_us": kept.iqr_us}]}
        band = final["tie_band"] if final else math.nan
        winner = final["winner"] if final else ""
        base = {"model": model, "run": run, "kernel": kernel,
                "problem": problem_label(static_key), "bucket": int(bucket), "tie_band": band,
                "winner": winner}
        measured = {f["config"]: f for f in (final["finalists"] if final else [])}
        own = measured.get(winner, {})
        rows.append({**base, "kind": "winner", "config": winner,
                     "median_us": own.get("median_us", math.nan),
                     "iqr_us": own.get("iqr_us", math.nan)})
        rows += [{**base, "kind": "finalist", "config": config, "median_us": f["median_us"],
                  "iqr_us": f["iqr_us"]} for config, f in measured.items()]
        ok = group[group["status"] == "ok"]
        rows += [{**base, "kind": "trial", "config": t.config_json, "median_us": t.median_us,
                  "iqr_us": t.iqr_us} for t in ok.itertuples()]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def run_all(models: Sequence[str], runs: Sequence[int], tokens: Sequence[int], state: Path,
            out: Path, budget_s: float) -> None:
    state.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    start, longest = time.monotonic(), 0.0
    for run in runs:
        for model in models:
            name = run_name(model, run)
            if (out / f"{name}.csv").exists() or (state / f"{name}.csv").exists():
                print(f"{name}: done before", flush=True)
                continue
            left = budget_s - (time.monotonic() - start)
            if longest > left:
                print(f"stopping before {name}: the longest run took {longest:.0f} s, "
                      f"{left:.0f} s of the budget are left; the same command continues",
                      flush=True)
                return
            wall = tune_once(model, run, tokens, state)
            longest = max(longest, wall)
            rows = run_rows(f"sqlite:///{state / f'{name}.db'}", model, run)
            for folder in (state, out):
                rows.to_csv(folder / f"{name}.csv", index=False)
            buckets = int((rows["kind"] == "winner").sum())
            print(f"{name}: {wall:.1f} s wall, {buckets} buckets", flush=True)


# -- step 2: the comparison --------------------------------------------------------------------


def compare(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, kernel, problem, bucket) of the runs' rows (RUN_COLUMNS)."""
    rows = []
    for (model, kernel, problem, bucket), group in runs.groupby(
            ["model", "kernel", "problem", "bucket"], sort=False):
        named = group[group["kind"] == "winner"].set_index("run")["config"].fillna("")
        counts = named.value_counts()
        # The most runs; among as many, the fixed order's first (canonical JSON as text).
        modal = min(counts.index, key=lambda c: (-counts[c], c))
        gap = _largest_gap(group, named) if len(counts) > 1 else None
        rows.append({
            "model": model, "kernel": kernel, "problem": problem, "bucket": int(bucket),
            "runs": len(named), "winners": len(counts), "same_winner": len(counts) == 1,
            "modal_runs": int(counts[modal]),
            "gap_pct": round(100 * gap[0], 3) if gap else math.nan,
            "band_pct": round(100 * gap[1], 3) if gap else math.nan,
            "within_band": (gap[0] <= gap[1] + SLACK) if gap else math.nan,
            "gap_measured": gap[2] if gap else "", "modal_winner": modal})
    return pd.DataFrame(rows, columns=list(COMPARE_COLUMNS))


def _largest_gap(group: pd.DataFrame, named: pd.Series) -> tuple[float, float, str]:
    """Over every run and every other run's winner: how much slower that winner was than this
    run's own, in this run (side by side where both were finalists, else by search times),
    with this run's band; the case furthest beyond its band. A winner this run never timed
    verified counts as infinitely slower ('not timed')."""
    worst = None
    for run, own in named.items():
        in_run = group[group["run"] == run]
        band = float(in_run["tie_band"].iloc[0])
        for other in set(named) - {own}:
            gap, how = _gap_in_run(in_run, own, other)
            if worst is None or gap - band > worst[0] - worst[1]:
                worst = (gap, band, how)
    return worst


def _gap_in_run(in_run: pd.DataFrame, own: str, other: str) -> tuple[float, str]:
    for kind, how in (("finalist", "side by side"), ("trial", "search times")):
        times = in_run[in_run["kind"] == kind].set_index("config")["median_us"]
        if own in times.index and other in times.index:
            return times[other] / times[own] - 1, how
    return math.inf, "not timed"


def compare_files(paths: Sequence[Path]) -> pd.DataFrame:
    """The runs' CSVs compared (read_runs)."""
    return compare(read_runs(paths))


def read_runs(paths: Sequence[Path]) -> pd.DataFrame:
    """The rows of the runs' CSVs; each must hold runs no other file holds (a run's rows are
    told apart by model and run number, which the file's name does not set)."""
    frames, holder = [], {}
    for path in paths:
        frame = pd.read_csv(path, dtype={"config": str, "winner": str})
        for model, run in frame[["model", "run"]].drop_duplicates().itertuples(index=False):
            if (model, run) in holder:
                raise SystemExit(f"{holder[model, run]} and {path} both hold run {run} of "
                                 f"{model}: each run must be in one file only")
            holder[model, run] = path
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


# -- BENCHMARKS.md ------------------------------------------------------------------------------


def summary_lines(frame: pd.DataFrame) -> list[str]:
    """Per model: buckets, how many named one winner in every run, and how many differ within
    and beyond the band; then each bucket that differs."""
    lines = ["| model | runs | buckets | same winner | differ, within band | differ, beyond "
             "band |", "|---|---:|---:|---:|---:|---:|"]
    for model, rows in frame.groupby("model", sort=False):
        differ = rows[~rows["same_winner"].astype(bool)]
        within = int(differ["within_band"].astype(bool).sum())
        share = rows["same_winner"].astype(bool).mean()
        mark = "" if share >= TARGET_SAME_SHARE else "**"
        lines.append(f"| {model} | {rows['runs'].max()} | {len(rows)} | "
                     f"{mark}{int(rows['same_winner'].astype(bool).sum())} "
                     f"({100 * share:.0f}%){mark} | {within} | {len(differ) - within} |")
    differ = frame[~frame["same_winner"].astype(bool)]
    if differ.empty:
        return lines
    lines += ["", "| model | kernel | problem | bucket | winners (runs of the most named) | "
              "largest gap | band | measured |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in differ.itertuples():
        gap = "-" if math.isinf(r.gap_pct) else f"{r.gap_pct:.2f}%"
        lines.append(f"| {r.model} | {r.kernel} | {r.problem} | {r.bucket} | {r.winners} "
                     f"({r.modal_runs} of {r.runs}) | {gap} | {r.band_pct:.2f}% | "
                     f"{r.gap_measured} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    run = steps.add_parser("run", help="fresh tuning runs on this GPU, resumable")
    run.add_argument("--out", type=Path, required=True, help="where each run's CSV goes")
    run.add_argument("--state", type=Path, default=Path("/tmp/cutetune-winner-repro"),
                     help="the runs' databases, logs and shared artifact cache")
    run.add_argument("--models", default=",".join(MODELS))
    run.add_argument("--runs", default=",".join(map(str, RUNS)))
    run.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    run.add_argument("--budget-s", type=float, default=540.0,
                     help="start no run the longest so far would not finish within")
    rows = steps.add_parser("rows", help="one run's CSV from a database tuned elsewhere")
    rows.add_argument("db_url", help="the run's database (SQLAlchemy URL)")
    rows.add_argument("--model", required=True, help="the model the run tuned")
    rows.add_argument("--run", type=int, required=True, help="the run's number in the CSV")
    rows.add_argument("--out", type=Path, required=True, help="the run's CSV")
    comparing = steps.add_parser("compare", help="compare the runs' winners")
    comparing.add_argument("runs", nargs="+", type=Path, help="the runs' CSVs")
    comparing.add_argument("--out", type=Path, required=True, help="the comparison's CSV")
    args = parser.parse_args()
    if args.step == "run":
        run_all(args.models.split(","), [int(r) for r in args.runs.split(",")],
                [int(t) for t in args.tokens.split(",")], args.state, args.out, args.budget_s)
        return
    if args.step == "rows":
        run_rows(args.db_url, args.model, args.run).to_csv(args.out, index=False)
        return
    frame = compare_files(args.runs)
    frame.to_csv(args.out, index=False)
    print("\n".join(summary_lines(frame)))


if __name__ == "__main__":
    main()
