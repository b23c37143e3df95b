"""The shape of exhaustive measurements, on the CPU (the reasons BENCHMARKS.md's targets section
gives for the replayed searches): per bucket, how many points lie within 3% of the best and how
much slower the median point is; per kernel, how far the heuristic default is from the best;
and in how many buckets the calibrated model (fitted on the presets) picks the default.

    python3 -m benchmarks.landscape EXHAUSTIVE.csv[.xz] [--device H200]

Spreads are p10-p90 over buckets, by rank (the value at index int(q * n) of the sorted list).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.replay_tables import buckets_of, complete, fit_presets, read_rows
from cutetune.device.funnel import predicted_best
from cutetune.device.specs import DEVICE_SPECS, DeviceSpec

NEAR_TIE = 0.03  # "within 3% of the best"
DECODE_MAX = 64  # decode buckets: 1 to 64 tokens
MID_MAX = 512  # the buckets the prune band is judged on: 1 to 512 tokens


def by_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * len(ordered))]


def landscape_lines(exhaustive: Path, spec: DeviceSpec) -> list[str]:
    rows = read_rows(exhaustive)
    calibrated = fit_presets(rows, spec)
    buckets, _ = complete(buckets_of(rows), spec)
    near_ties, median_over_best, default_over_best = [], [], {}
    picks_default = 0
    for b in buckets:
        kernel, problem = b.kernel_and_problem()
        measured = sorted(us for us in b.times.values() if us is not None)
        best = measured[0]
        if b.bucket <= DECODE_MAX:
            near_ties.append(sum(us <= best * (1 + NEAR_TIE) for us in measured))
        if b.bucket <= MID_MAX:
            median_over_best.append(statistics.median(measured) / best)
        default = kernel.default_config(problem, spec)
        default_over_best.setdefault(b.kernel, []).append(b.times[default] / best - 1)
        picks_default += predicted_best(kernel, problem, spec, calibrated, default) == default
    lines = [f"buckets of 1-{DECODE_MAX} tokens: points within {100 * NEAR_TIE:.0f}% of the "
             f"best: median {statistics.median(near_ties):g} (p10-p90 {by_rank(near_ties, 0.1)}"
             f"-{by_rank(near_ties, 0.9)})",
             f"buckets of 1-{MID_MAX} tokens: the median point over the best: "
             f"{min(median_over_best):.2f}-{max(median_over_best):.2f}x",
             f"the calibrated model picks the heuristic default in {picks_default} of "
             f"{len(buckets)} buckets"]
    lines += [f"{kernel}: the default over the best: {100 * min(gaps):.1f}-{100 * max(gaps):.1f}%"
              for kernel, gaps in sorted(default_over_best.items())]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exhaustive", type=Path)
    parser.add_argument("--device", default="H200", choices=sorted(DEVICE_SPECS),
                        help="the GPU the measurements were made on")
    args = parser.parse_args()
    print("\n".join(landscape_lines(args.exhaustive, DEVICE_SPECS[args.device])))


if __name__ == "__main__":
    main()
