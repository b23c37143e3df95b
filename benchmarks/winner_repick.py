"""How would other tie bands have named the winners of recorded fresh runs? Each run's finals, as
winner_repro's CSVs hold them (re-measured side by side), are picked again by the tuner's own
rule (tuner/finals.pick: the preferred of the finalists tied with the fastest) at each band
floor, and the buckets where every run names one winner are counted, with the price: how much
slower than its run's fastest finalist the picked point measured. Of the buckets that still
differ, it counts those where a run names a point another run did not re-measure: there the
runs' searches and finalists, not the band, keep them apart.

    python3 -m benchmarks.winner_repick OUT/*-run*.csv [--device H200] [--floors 2,2.5,3,4,5]

Only the finalists the runs re-measured are re-picked, so a wider band's larger admission (the
near-fastest the order prefers) is not seen: the counts are what the band alone changes. The
order's predictions are today's datasheet model's, not those of the run's measured ceilings, so
at a run's own band a re-pick may name another of its tied points. A bucket whose problem
today's kernels no longer describe alike (a field added since) is left out and counted.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchmarks.winner_repro import problem_label, read_runs
from cutetune.device.measure import Measurement
from cutetune.device.specs import DEVICE_SPECS, Ceilings, DeviceSpec
from cutetune.kernels.registry import get_kernel
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from cutetune.tuner import finals
from cutetune.tuner.study import TrialOutcome
from cutetune.tuner.tune import plan_bucket

FLOORS_PERCENT = (2.0, 2.5, 3.0, 4.0, 5.0)


@dataclass(frozen=True)
class Repick:
    floor: float
    buckets: int
    same_winner: int
    # Of the buckets whose runs differ: those where a run names a point another run did not
    # re-measure (untried there, or tried and not a finalist), so no band could tie them there.
    unshared: int
    price_median_pct: float
    price_max_pct: float


def _bucket_finals(group: pd.DataFrame, spec: DeviceSpec, ceilings: Ceilings
                   ) -> tuple[dict[int, list[TrialOutcome]], object] | None:
    """Each run's finalists of one bucket as TrialOutcomes (config, re-measured times, the
    cost model's prediction) and the bucket's default; None where no problem of the model
    has the bucket's label today."""
    first = group.iloc[0]
    kernel = get_kernel(first["kernel"])
    statics = [p for p in kernel.problems_for_model(load_model(first["model"]), "bfloat16")
               if problem_label(p.static_key()) == first["problem"]]
    if not statics:
        return None
    plan = plan_bucket(kernel, statics[0], int(first["bucket"]), spec, ceilings)
    points = {config_to_json(p.config): p for p in plan.plan.kept + plan.plan.pruned}
    by_run = {}
    for run, rows in group.groupby("run"):
        rows = rows.drop_duplicates("config")
        by_run[int(run)] = [TrialOutcome(number, points[row.config].config,
                                         Measurement(row.median_us, row.iqr_us, 1), None,
                                         points[row.config].prediction.predicted_us)
                            for number, row in enumerate(rows.itertuples())]
    return by_run, plan.default


def repick(runs: pd.DataFrame, spec: DeviceSpec, floors: Sequence[float]
           ) -> tuple[list[Repick], int]:
    """Per floor (a fraction), the buckets where every run names one winner; and how many
    buckets were left out (no problem of today's kernels has their label)."""
    ceilings = Ceilings.from_datasheet(spec)
    finals_rows = runs[runs["kind"].isin(["winner", "finalist"]) & runs["config"].notna()]
    buckets, left_out = [], 0
    for _, group in finals_rows.groupby(["model", "kernel", "problem", "bucket"]):
        found = _bucket_finals(group, spec, ceilings)
        if found is None:
            left_out += 1
        else:
            buckets.append(found)
    # Each run's finalists by canonical JSON, the same at every floor.
    remeasured = [[{config_to_json(t.config) for t in outcomes} for outcomes in by_run.values()]
                  for by_run, _ in buckets]
    results = []
    for floor in floors:
        same, unshared, prices = 0, 0, []
        for (by_run, default), finalists_of_runs in zip(buckets, remeasured, strict=True):
            picked = [finals.pick(outcomes, default, floor) for outcomes in by_run.values()]
            winners = {config_to_json(p.winner.config) for p in picked}
            same += len(winners) == 1
            unshared += any(not winners <= names for names in finalists_of_runs)
            prices += [p.winner.measurement.median_us
                       / min(t.measurement.median_us for t in p.finalists) - 1 for p in picked]
        results.append(Repick(floor, len(buckets), same, unshared,
                              100 * statistics.median(prices),
                              100 * max(prices)))
    return results, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="winner_repro's run CSVs")
    parser.add_argument("--device", default="H200", choices=sorted(DEVICE_SPECS),
                        help="the cost model that orders tied points")
    parser.add_argument("--floors", default=",".join(map(str, FLOORS_PERCENT)),
                        help="band floors to try, in percent")
    args = parser.parse_args()
    runs = read_runs(args.runs)
    floors = [float(f) / 100 for f in args.floors.split(",")]
    results, left_out = repick(runs, DEVICE_SPECS[args.device], floors)
    for r in results:
        print(f"floor {100 * r.floor:g}%: one winner in {r.same_winner} of {r.buckets} buckets "
              f"({r.unshared} of the rest name a point another run did not re-measure); the "
              f"picked point's price over its run's fastest finalist {r.price_median_pct:.2f}% "
              f"at the median, {r.price_max_pct:.2f}% at most")
    if left_out:
        print(f"{left_out} buckets left out: their problem is no longer described alike")


if __name__ == "__main__":
    main()
