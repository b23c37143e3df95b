"""How honest `cutetune tune`'s ETA is (issue 38: within 30% of the true remaining time once 5%
of the trials are done). One whole-model tune into a fresh database with a cold artifact cache,
run as `cutetune tune --model M --tokens T` runs it (tuner/model_run.py, with the CLI's progress
display), recording after every trial the ETA the status line shows. At the end, for the first
trial at or past 5%, 25% and 50% of the trials planned: that ETA beside the true remaining time
(from then until the run returned), and beside the ETA the status line showed before
tuner/eta.py (the mean rate of trials since the start, times the trials left).

    python3 -m benchmarks.tune_eta --model tests/data/hf_configs/Kimi-K2-Instruct.json \\
        --tokens 1,64,4096 --out OUT.csv [--readings READINGS.csv] [--compiles COMPILES.csv]

A Kimi-K2 config at those three buckets fits one 10-minute device call; at six (1 to 32768)
it has about 2000 trials since its FP8 quantisation and MLA rotary kernels joined, which an
H100 had half done after 4.5 minutes. The reading at every trial goes to --readings, with the
trial's kernel and what the run's time split (tuner/isolated.py TimeSplit) held by then: the
GPU worker's verify and timing seconds, the seconds trials waited for compiles, and the CPU
seconds of the compiles the pool has finished. From those the tuner's own time between trials
can be told per kernel and against the pool's activity, which the ETA's rates are calibrated
from. Every compile the pool ran goes to --compiles (its kernel, seconds and finish), which the
ETA prices the rest of the compile queue on: without them a reading does not tell a slow
estimate of the queue from a slow estimate of the trials.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from cutetune.build.compile_pool import FinishedCompile
from cutetune.cli.problems import model_problems
from cutetune.cli.progress import RunProgress, time_split_line
from cutetune.kernels.registry import get_kernel, kernel_names
from cutetune.results_db import Database
from cutetune.tuner.isolated import Workers
from cutetune.tuner.model_run import RunOptions, Unit, tune_model

SHARES = (0.05, 0.25, 0.5)
# The buckets a run within one 10-minute device call tunes: decode to prefill.
DEFAULT_TOKENS = (1, 64, 4096)


@dataclass(frozen=True)
class Reading:
    """After a trial: seconds since the run started, trials done, the ETA shown, the trial's
    kernel, and the run's time split so far (seconds); then the trial's bucket (its static
    problem's key and token bucket), which a replay of the run (eta_replay.py) groups by."""

    elapsed_s: float
    done: int
    eta_s: float
    kernel: str
    gpu_busy_s: float
    compile_wait_s: float
    compile_cpu_s: float
    problem: str = ""
    bucket: int = 0


class RecordingProgress(RunProgress):
    """The CLI's progress display, noting the ETA it shows after each trial."""

    def __init__(self, workers: Workers, stream: TextIO | None = None):
        super().__init__(stream)
        self.workers = workers
        self.readings: list[Reading] = []
        self.planned = 0
        self.started_at: float | None = None

    def started(self, fingerprint, ceilings, pending, skipped, eta=None) -> None:
        super().started(fingerprint, ceilings, pending, skipped, eta)
        self.planned = sum(bucket.trials for bucket in pending)
        self.started_at = time.monotonic()

    def trial(self, planned, outcome, best) -> None:
        super().trial(planned, outcome, best)
        split = self.workers.split
        self.readings.append(Reading(time.monotonic() - self.started_at,
                                     len(self.readings) + 1, self.eta_s(), planned.kernel.name,
                                     split.verify_s + split.timing_s, split.compile_wait_s,
                                     self.workers.pool.cpu_seconds,
                                     planned.problem.static_key(), planned.bucket))


@dataclass(frozen=True)
class RecordedRun:
    readings: list[Reading]
    planned: int  # trials planned when the run started
    run_s: float  # from the run's start (its ETA's first reading) until it returned
    # Each compile the pool ran, its finish in seconds since the run's start: what the ETA
    # prices the rest of the compile queue on, by kernel.
    compiles: list[FinishedCompile] = field(default_factory=list)


def model_units(model: str, dtype: str) -> list[Unit]:
    """Every kernel problem `model` uses, as `cutetune tune --model` tunes them."""
    return [Unit(kernel, problem) for kernel in map(get_kernel, kernel_names())
            for problem in model_problems(kernel, model, dtype, skip_if_absent=True)]


def record_run(units: Sequence[Unit], buckets: Sequence[int], db: Database, workers: Workers,
               options: RunOptions, stream: TextIO | None = None) -> RecordedRun:
    """Tune `units` at `buckets` as `cutetune tune` does, noting the ETA after each trial."""
    progress = RecordingProgress(workers, stream)
    with progress:
        tune_model(units, buckets, db, workers, options, progress)
    ended = time.monotonic()
    if progress.started_at is None:
        raise SystemExit("the run never started")
    compiles = [dataclasses.replace(c, finished_at=c.finished_at - progress.started_at)
                for c in workers.pool.finished]
    return RecordedRun(progress.readings, progress.planned, ended - progress.started_at,
                       compiles)


def rows(run: RecordedRun, shares: Sequence[float] = SHARES) -> list[dict]:
    """For each share of the planned trials, the first reading at or past it: the ETA, the true
    remaining time, the mean-rate ETA, and each ETA's error in percent of the truth."""
    out = []
    for share in shares:
        reading = next((r for r in run.readings if r.done >= share * run.planned), None)
        if reading is None:
            continue
        true_s = run.run_s - reading.elapsed_s
        mean_rate_s = reading.elapsed_s / reading.done * max(0, run.planned - reading.done)
        out.append({
            "share_pct": round(100 * share), "trials_done": reading.done,
            "trials_planned": run.planned, "elapsed_s": round(reading.elapsed_s, 1),
            "eta_s": round(reading.eta_s, 1), "true_remaining_s": round(true_s, 1),
            "eta_error_pct": round(100 * (reading.eta_s - true_s) / true_s, 1),
            "mean_rate_eta_s": round(mean_rate_s, 1),
            "mean_rate_error_pct": round(100 * (mean_rate_s - true_s) / true_s, 1),
            "run_s": round(run.run_s, 1)})
    return out


def write_csv(path: str, table: Sequence[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a preset or a config.json")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                        help="token buckets, comma-separated")
    parser.add_argument("--trials", type=int, default=None, help="trial budget per bucket")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None, help="CSV of the ETA at 5%%, 25%%, 50%%")
    parser.add_argument("--readings", default=None, help="CSV of the ETA after every trial")
    parser.add_argument("--compiles", default=None,
                        help="CSV of every compile: its kernel, seconds and finish")
    args = parser.parse_args()

    import torch

    from cutetune.tuner.defaults import DEFAULT_BUDGET

    if not torch.cuda.is_available():
        raise SystemExit("the ETA benchmark tunes on a CUDA GPU and none is visible")
    kernels = [get_kernel(name) for name in kernel_names()]
    units = model_units(args.model, args.dtype)
    buckets = sorted({int(t) for t in args.tokens.split(",")})
    with tempfile.TemporaryDirectory(prefix="cutetune-eta-") as directory:
        db = Database.open(f"sqlite:///{Path(directory) / 'tune.db'}")
        workers = Workers(Path(directory), sorted({k.compile_function.__module__
                                                   for k in kernels}))
        run = record_run(units, buckets, db, workers,
                         RunOptions(args.trials or DEFAULT_BUDGET), sys.stderr)
        db.dispose()
    print(time_split_line(workers.split, workers.compile_processes))
    table = [{"model": Path(args.model).stem, "tokens": args.tokens, **row}
             for row in rows(run)]
    for row in table:
        print(f"{row['share_pct']:3d}% ({row['trials_done']}/{row['trials_planned']} trials, "
              f"{row['elapsed_s']:.0f} s in): ETA {row['eta_s']:.0f} s, true "
              f"{row['true_remaining_s']:.0f} s ({row['eta_error_pct']:+.0f}%); mean-rate ETA "
              f"{row['mean_rate_eta_s']:.0f} s ({row['mean_rate_error_pct']:+.0f}%)",
              flush=True)
    if args.out and table:
        write_csv(args.out, table)
    if args.readings and run.readings:
        write_csv(args.readings, [{**asdict(r), "true_remaining_s":
                                   round(run.run_s - r.elapsed_s, 2)} for r in run.readings])
    if args.compiles and run.compiles:
        write_csv(args.compiles, [asdict(c) for c in run.compiles])


if __name__ == "__main__":
    main()
