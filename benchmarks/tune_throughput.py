"""Trials per hour of `cutetune tune` on one GPU against several (issue 26: at least 1.8x on two):
the same tune command once per --gpus set, each into a fresh database with a cold artifact cache
(so each run compiles what it times, as a user's first run does); the wall time of the whole
process and the trials it stored give its trials per hour, and the last column the ratio to the
first set's.

    python3 -m benchmarks.tune_throughput --model qwen3-8b --gpus 0 --gpus 0,1 [--out F.csv]
        [-- more tune arguments, e.g. qk_norm --tokens 1,64 --trials 8]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cutetune.results_db import Database, trials_frame


def stored_trials(db_url: str) -> int:
    db = Database.open(db_url)
    try:
        return len(trials_frame(db))
    finally:
        db.dispose()


def timed_run(model: str, gpus: str, tune_arguments: list[str], directory: Path) -> dict:
    """One tune run of `gpus` into its own database and cache under `directory`."""
    db_url = f"sqlite:///{directory / 'tune.db'}"
    command = [sys.executable, "-m", "cutetune.cli.main", "--db", db_url, "tune",
               *tune_arguments, "--model", model, "--gpus", gpus]
    start = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "CUTETUNE_CACHE_DIR": str(directory)},
                          capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"--gpus {gpus}: {' '.join(command)} failed ({done.returncode}):\n"
                         f"{done.stderr.strip()[-2000:]}")
    trials = stored_trials(db_url)
    return {"model": model, "gpus": gpus, "trials": trials, "wall_s": round(wall_s, 1),
            "trials_per_hour": round(trials / wall_s * 3600)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--gpus", action="append", required=True,
                        help="a --gpus set to run (give two or more)")
    parser.add_argument("--out", default=None, help="CSV to write")
    parser.add_argument("tune_arguments", nargs="*", help="after --: more tune arguments")
    args = parser.parse_args()
    rows = []
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="cutetune-throughput-") as directory:
            rows.append(timed_run(args.model, gpus, args.tune_arguments, Path(directory)))
        rows[-1]["vs_first"] = round(rows[-1]["trials_per_hour"] / rows[0]["trials_per_hour"], 2)
        row = rows[-1]
        print(f"--gpus {row['gpus']:8s} {row['trials']:5d} trials in {row['wall_s']:7.1f} s: "
              f"{row['trials_per_hour']:6d} trials/hour ({row['vs_first']:.2f}x the first)",
              flush=True)
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
