"""The replay, pruning and zero-shot tables (issue 42 item 3) from `benchmarks.exhaustive`'s CSV,
on the CPU: the presets' measurements fit the calibration (cutetune/device/calibration_fit.py);
each preset bucket's search is replayed (cutetune/tuner/replay.py) with the datasheet roofline
and with the calibrated model; the other buckets (the held-out models' shapes, which no preset has:
benchmarks.exhaustive.HELD_OUT) test the calibrated model fitted on the presets only. Serving's
pick for an untuned problem borrows the presets' exhaustive bests (the winners tuning would
store) of the kernel at the bucket, a preset problem the other presets' only. A bucket
without a row for every valid point (the measurements span device calls, so each call may stop
in one) is left out of the replays, and the count is printed.

    python3 -m benchmarks.replay_tables EXHAUSTIVE.csv[.xz] [MORE.csv[.xz] ...] [--device H200]
        --out benchmarks/results/replay-COMMIT.csv

--device names the GPU the measurements were made on (its datasheet spec plans the searches);
a committed CSV is xz-compressed and read as it is.

One row per (cost model, scope, kernel), "all" kernels first: the medians and shares BENCHMARKS.md
shows against the targets (TARGETS).
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.calibration_fit import fit
from cutetune.device.funnel import Lender
from cutetune.device.specs import DEVICE_SPECS, Ceilings, DeviceSpec
from cutetune.kernels.registry import KernelDef, NotApplicableError, get_kernel, kernel_names
from cutetune.spaces.models import PRESET_NAMES, load_model
from cutetune.spaces.problem import Problem
from cutetune.tuner.calibrate import samples_of
from cutetune.tuner.replay import BucketReplay, replay_bucket, summarize

COLUMNS = ("cost_model", "scope", "kernel", "buckets", "median_kept_pct", "max_regret_pct",
           "regret_within_1pct_share", "median_search_pct", "zero_shot_within_3pct_share",
           "model_pick_within_3pct_share", "calibration")
# Issue 42's targets: kept at most 20% of the valid points, regret at most 1%, within 2% of the
# exhaustive best in at most 25% of its trials (median over buckets), the top pick within 3%
# in at least 90% of (problem, bucket) pairs.
TARGETS = {"median_kept_pct": 20.0, "max_regret_pct": 1.0, "median_search_pct": 25.0,
           "zero_shot_within_3pct_share": 0.9}


@dataclass(frozen=True)
class Bucket:
    kernel: str
    static_key: str
    bucket: int
    times: dict  # config -> median_us, or None where it failed

    def kernel_and_problem(self) -> tuple[KernelDef, Problem]:
        kernel = get_kernel(self.kernel)
        return kernel, kernel.problem_type.from_static_key(self.static_key, self.bucket)


def read_rows(path: Path) -> list[dict]:
    """The rows of an exhaustive CSV, plain or xz-compressed (by its suffix)."""
    with (lzma.open(path, "rt", newline="") if path.suffix == ".xz"
          else path.open(newline="")) as f:
        return list(csv.DictReader(f))


def problems_of(models: Sequence[str]) -> set[tuple[str, str]]:
    """(kernel, static key) of every problem the models use."""
    keys = set()
    for model in models:
        shape = load_model(model)
        for name in kernel_names():
            try:
                problems = get_kernel(name).problems_for_model(shape, "bfloat16")
            except NotApplicableError:
                continue
            keys |= {(name, p.static_key()) for p in problems}
    return keys


def buckets_of(rows: Iterable[dict]) -> list[Bucket]:
    grouped: dict[tuple[str, str, int], dict] = {}
    for row in rows:
        kernel = get_kernel(row["kernel_name"])
        config = kernel.space.config_from_dict(json.loads(row["config_json"]))
        times = grouped.setdefault((row["kernel_name"], row["static_key"], int(row["bucket"])),
                                   {})
        times[config] = float(row["median_us"]) if row["status"] == "ok" else None
    return [Bucket(k, s, b, times) for (k, s, b), times in grouped.items()]


def complete(buckets: Sequence[Bucket], spec: DeviceSpec) -> tuple[list[Bucket], int]:
    """The buckets with a row (a time or a failure) for every valid point on `spec`, and how
    many lack one: the exhaustive best of a bucket measured in part is not known, and
    measurements that span several device calls leave the last bucket of each in part."""
    whole = []
    for b in buckets:
        kernel, problem = b.kernel_and_problem()
        if all(c in b.times for c in kernel.space.valid_points(problem, spec)):
            whole.append(b)
    return whole, len(buckets) - len(whole)


def exhaustive_bests(buckets: Sequence[Bucket]) -> dict[int, dict[Lender, Any]]:
    """Each bucket's fastest point, by bucket and lender (kernel, static key): the winners
    tuning would store, which serving lends to the kernel's other problems at that bucket (and
    to the kernels that borrow from it)."""
    bests: dict[int, dict[Lender, Any]] = {}
    for b in buckets:
        measured = {c: us for c, us in b.times.items() if us is not None}
        bests.setdefault(b.bucket, {})[Lender(b.kernel, b.static_key)] = min(
            measured, key=measured.get)
    return bests


def replay(buckets: Sequence[Bucket], spec: DeviceSpec, calibrated: CalibratedModel | None,
           lenders: dict[int, dict[Lender, Any]]) -> list[tuple[str, BucketReplay]]:
    """Each bucket replayed; its problem may borrow the `lenders` at its bucket (its own is
    never lent to it: each preset problem is served as untuned by the others)."""
    ceilings = Ceilings.from_datasheet(spec)
    return [(b.kernel, replay_bucket(*b.kernel_and_problem(), b.times, spec, ceilings,
                                     calibrated, lenders=lenders.get(b.bucket)))
            for b in buckets]


def summary_rows(cost_model: str, scope: str, replays: Sequence[tuple[str, BucketReplay]],
                 calibration: str) -> list[dict]:
    rows = []
    for kernel in ["all", *sorted({k for k, _ in replays})]:
        chosen = [r for k, r in replays if kernel in ("all", k)]
        s = summarize(chosen)
        rows.append({"cost_model": cost_model, "scope": scope, "kernel": kernel,
                     "buckets": s.buckets, "median_kept_pct": 100 * s.median_kept_fraction,
                     "max_regret_pct": 100 * s.max_regret,
                     "regret_within_1pct_share": s.within_regret_band,
                     "median_search_pct": 100 * s.median_search_fraction,
                     "zero_shot_within_3pct_share": s.zero_shot_within_band,
                     "model_pick_within_3pct_share": s.model_pick_within_band,
                     "calibration": calibration if kernel == "all" else ""})
    return rows


def fit_presets(rows: Sequence[dict], spec: DeviceSpec,
                left_out: tuple[str, str] | None = None) -> CalibratedModel:
    """The calibration of `spec`'s GPU fitted on the presets' rows of an exhaustive CSV, less
    the problem `left_out` (kernel, static key) where given."""
    fitted = problems_of(PRESET_NAMES) - {left_out}
    return fit(samples_of(({**r, "bucket": int(r["bucket"]),
                            "median_us": float(r["median_us"]) if r["status"] == "ok" else None}
                           for r in rows if (r["kernel_name"], r["static_key"]) in fitted),
                          spec), spec, f"NVIDIA {spec.name}")


def replay_left_out(rows: Sequence[dict], buckets: Sequence[Bucket], spec: DeviceSpec,
                    lenders: dict[int, dict[Lender, Any]]
                    ) -> list[tuple[str, BucketReplay]]:
    """Each preset problem's buckets replayed with the model fitted on the other presets'
    trials alone, as a problem never tuned is planned: what its knob factors are worth where
    they are not fitted to the answer."""
    replays = []
    for problem in sorted({(b.kernel, b.static_key) for b in buckets}):
        calibrated = fit_presets(rows, spec, left_out=problem)
        replays += replay([b for b in buckets if (b.kernel, b.static_key) == problem], spec,
                          calibrated, lenders)
    return replays


def tables(exhaustive: Path | Sequence[Path], spec: DeviceSpec = DEVICE_SPECS["H200"]
           ) -> list[dict]:
    """The summary rows of measurements made on `spec`'s GPU, in one CSV or several (each
    device call's own, say)."""
    paths = [exhaustive] if isinstance(exhaustive, Path) else exhaustive
    rows = [row for path in paths for row in read_rows(path)]
    presets = problems_of(PRESET_NAMES)
    fitted = [r for r in rows if (r["kernel_name"], r["static_key"]) in presets]
    calibrated = fit_presets(rows, spec)
    known, known_partial = complete(buckets_of(fitted), spec)
    held_out, held_out_partial = complete(
        buckets_of(r for r in rows if (r["kernel_name"], r["static_key"]) not in presets), spec)
    if known_partial or held_out_partial:
        print(f"left out, not every valid point measured: {known_partial} preset buckets, "
              f"{held_out_partial} held-out buckets")
    lenders = exhaustive_bests(known)
    out = summary_rows("datasheet", "presets", replay(known, spec, None, lenders), "")
    out += summary_rows("calibrated", "presets", replay(known, spec, calibrated, lenders),
                        calibrated.describe())
    out += summary_rows("calibrated", "presets, own problem not fitted",
                        replay_left_out(rows, known, spec, lenders),
                        "each problem fitted on the other preset problems' trials only")
    if held_out:
        out += summary_rows("calibrated", "held-out",
                            replay(held_out, spec, calibrated, lenders),
                            "fitted on the presets only")
    return out


def markdown_lines(path: Path) -> list[str]:
    """The table BENCHMARKS.md shows, figures past a target in bold."""

    def cell(column: str, value: float) -> str:
        text = f"{100 * value:.0f}%" if column.endswith("share") else f"{value:.1f}%"
        target = TARGETS.get(column)
        missed = target is not None and (value < target if column.endswith("share")
                                         else value > target)
        return f"**{text}**" if missed else text

    frame = pd.read_csv(path, keep_default_na=False)
    lines = ["| cost model | buckets of | kernel | buckets | kept (median) | regret (max) | "
             "regret <= 1% | trials to 2% (median) | top pick within 3% | "
             "the model's own pick within 3% |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in frame.itertuples():
        lines.append(
            f"| {r.cost_model} | {r.scope} | {r.kernel} | {r.buckets} | "
            f"{cell('median_kept_pct', r.median_kept_pct)} | "
            f"{cell('max_regret_pct', r.max_regret_pct)} | "
            f"{cell('regret_within_1pct_share', r.regret_within_1pct_share)} | "
            f"{cell('median_search_pct', r.median_search_pct)} | "
            f"{cell('zero_shot_within_3pct_share', r.zero_shot_within_3pct_share)} | "
            f"{100 * r.model_pick_within_3pct_share:.0f}% |")
    fits = [f"- {r.cost_model}, {r.scope}: {r.calibration}" for r in frame.itertuples()
            if r.calibration]
    return lines + ([""] + fits if fits else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exhaustive", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="H200", choices=sorted(DEVICE_SPECS),
                        help="the GPU the measurements were made on")
    args = parser.parse_args()
    rows = tables(args.exhaustive, DEVICE_SPECS[args.device])
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print("\n".join(markdown_lines(args.out)))


if __name__ == "__main__":
    main()
