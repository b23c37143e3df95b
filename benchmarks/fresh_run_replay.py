"""Fresh runs replayed over exhaustive measurements (issue 38 item 1, on the CPU): each preset
bucket of `benchmarks.exhaustive`'s CSV searched --runs times by the tuner (datasheet roofline,
the default budget and band), each run reading the stored times through its own noise
(cutetune/tuner/replay.py, RunNoise); the share of buckets where every run names one winner,
and the largest gap between two runs' winners by stored times.

    python3 -m benchmarks.fresh_run_replay EXHAUSTIVE.csv[.xz] [--runs 5] [--device H200]
        [--models M,M|presets|held-out] [--drift-pct 0.96] [--jitter-pct 0.25] [--tie-band 3]
        [--warm-start-share 4] [--lend] [--incumbent]

The default noise is what fresh H200 runs measured (tuner/finals.py): the ratio of the same two
finalists moved by 2.7% at p95 between runs, which two points' independent lognormal drifts of
sigma s give at 1.96 * sqrt(2) * s, so s = 0.96%; the IQR of one set of rounds is 0.33% of the
median for half the trials, a sigma of 0.25%. It answers how a change to the search or the
finals moves the share, not what fresh runs on the GPU measure (benchmarks.winner_repro).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.exhaustive import models_of
from benchmarks.replay_tables import (
    Bucket,
    buckets_of,
    complete,
    exhaustive_bests,
    problems_of,
    read_rows,
)
from cutetune.device.funnel import Lender
from cutetune.device.specs import DEVICE_SPECS, Ceilings, DeviceSpec
from cutetune.tuner.defaults import DEFAULT_TIE_BAND_PERCENT
from cutetune.tuner.replay import IQR_PER_SIGMA, FreshRuns, RunNoise, fresh_runs
from cutetune.tuner.study import WARM_START_SHARE

MODELS = ("qwen3-8b", "qwen3-30b-a3b")  # issue 38's dense and MoE presets
P95_BETWEEN_RUNS = 0.027  # the ratio of the same two finalists, p95 over fresh H200 runs
DRIFT = math.log(1 + P95_BETWEEN_RUNS) / (1.96 * math.sqrt(2))
JITTER = 0.0033 / IQR_PER_SIGMA  # the median IQR / median of one set of rounds, as a sigma


def lenders_outside(buckets: Sequence[Bucket], models: Sequence[str]
                    ) -> list[dict[Lender, Any]]:
    """Per bucket, what a fresh run of a model using its problem is lent: the exhaustive bests
    at that bucket of the kernel's problems no such model uses (a run lends among none of its
    own problems: tuner/model_run.py)."""
    used = {model: problems_of([model]) for model in models}
    bests = exhaustive_bests(buckets)
    lent = []
    for b in buckets:
        own = set().union(*(keys for keys in used.values() if (b.kernel, b.static_key) in keys))
        lent.append({lender: config for lender, config in bests[b.bucket].items()
                     if tuple(lender) not in own})
    return lent


def replay_runs(buckets: Sequence[Bucket], spec: DeviceSpec, noise: RunNoise, runs: int,
                tie_band: float, warm_start_share: int = WARM_START_SHARE,
                lenders: Sequence[dict[Lender, Any]] | None = None,
                shipped_first: bool = False) -> list[tuple[str, FreshRuns]]:
    """Each bucket's fresh runs, lent `lenders` (one mapping per bucket; None: nothing), and
    with `shipped_first` offered the winner of one more run as their incumbent."""
    ceilings = Ceilings.from_datasheet(spec)
    return [(b.kernel, fresh_runs(*b.kernel_and_problem(), b.times, spec, ceilings, None,
                                  noise, runs, tie_band=tie_band,
                                  warm_start_share=warm_start_share,
                                  lenders=lenders[i] if lenders else None,
                                  shipped_first=shipped_first))
            for i, b in enumerate(buckets)]


def summary_lines(replays: Sequence[tuple[str, FreshRuns]]) -> list[str]:
    """Per kernel: the buckets whose runs all name one winner, the largest gap between two
    runs' winners, and what the winners cost against the exhaustive best (over every run)."""
    lines = ["| kernel | buckets | one winner | largest gap between winners | "
             "winner over the best: median | max |",
             "|---|---:|---:|---:|---:|---:|"]
    for kernel in ["all", *sorted({k for k, _ in replays})]:
        chosen = [r for k, r in replays if kernel in ("all", k)]
        one = sum(r.one_winner for r in chosen)
        prices = [p for r in chosen for p in r.prices]
        lines.append(f"| {kernel} | {len(chosen)} | {one} ({100 * one / len(chosen):.0f}%) | "
                     f"{100 * max(r.spread for r in chosen):.2f}% | "
                     f"{100 * statistics.median(prices):.2f}% | {100 * max(prices):.2f}% |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exhaustive", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="H200", choices=sorted(DEVICE_SPECS),
                        help="the GPU the measurements were made on")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="models (as benchmarks.exhaustive takes them)")
    parser.add_argument("--drift-pct", type=float, default=100 * DRIFT)
    parser.add_argument("--jitter-pct", type=float, default=100 * JITTER)
    parser.add_argument("--tie-band", type=float, default=DEFAULT_TIE_BAND_PERCENT,
                        help="the band's floor, in percent")
    parser.add_argument("--warm-start-share", type=int, default=WARM_START_SHARE,
                        help="1/N of the trial budget goes to the roofline's best-ranked "
                             "points (1: all of it, no TPE)")
    parser.add_argument("--lend", action="store_true",
                        help="lend each problem the exhaustive bests at its bucket of the "
                             "problems its models do not use, as stored winners lend theirs "
                             "to a tuning run")
    parser.add_argument("--incumbent", action="store_true",
                        help="offer each bucket's runs the winner of one more replayed run as "
                             "their incumbent, as a problem's shipped winner is to a tuning run "
                             "on a GPU of the model it was tuned on")
    args = parser.parse_args()
    for name in ("runs", "warm_start_share"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got "
                         f"{getattr(args, name)}")
    for name in ("drift_pct", "jitter_pct", "tie_band"):
        if not 0 <= getattr(args, name) < 100:
            parser.error(f"--{name.replace('_', '-')} must be a percentage from 0 to below 100,"
                         f" got {getattr(args, name)}")
    models = models_of(args.models)
    wanted = problems_of(models)
    spec = DEVICE_SPECS[args.device]
    rows = [r for r in read_rows(args.exhaustive) if (r["kernel_name"], r["static_key"]) in wanted]
    buckets, partial = complete(buckets_of(rows), spec)
    if partial:
        print(f"left out, not every valid point measured: {partial} buckets")
    if not buckets:
        raise SystemExit(f"{args.exhaustive}: no bucket of {args.models} measured in full")
    noise = RunNoise(args.drift_pct / 100, args.jitter_pct / 100)
    lenders = lenders_outside(buckets, models) if args.lend else None
    replays = replay_runs(buckets, spec, noise, args.runs, args.tie_band / 100,
                          args.warm_start_share, lenders, args.incumbent)
    print("\n".join(summary_lines(replays)))


if __name__ == "__main__":
    main()
