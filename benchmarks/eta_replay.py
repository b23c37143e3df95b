"""A recorded whole-model run's ETA played again on the CPU (issue 38 item 3): what the current
tuner/eta.py would have shown after each trial of a run `tune_eta` recorded on a GPU, beside
the true remaining time. An ETA rule is then judged against real runs without a device.

    python3 -m benchmarks.eta_replay --model M --tokens 1,64,4096 --device "H100 SXM" \\
        --readings READINGS.csv --compiles COMPILES.csv [--processes 12] [--out OUT.csv]

The run is planned as `cutetune tune` plans it into an empty database (tuner/model_run.py
plan_run and compile_order), on the device's datasheet ceilings: the recorded run measured its
own, so each bucket's predicted time differs a little. Its events are played at their recorded
moments: each trial (the readings: when it finished, the GPU worker's and the compile waits'
seconds so far), each bucket's start and end (halfway between its neighbours' trials; the
first bucket starts with the run), and
each compile's finish (the compiles: each kernel's, in the order they finished, to that
kernel's points in the order the run queued them). Readings from `tune_eta` before the bucket
columns (problem, bucket) cannot be replayed.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from collections import defaultdict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.tune_eta import model_units
from cutetune.build.compile_pool import CompileResult
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.results_db import Database, DeviceFingerprint
from cutetune.spaces.space import config_to_json
from cutetune.tuner.defaults import DEFAULT_BUDGET
from cutetune.tuner.eta import RunEta
from cutetune.tuner.isolated import TimeSplit
from cutetune.tuner.model_run import PendingBucket, RunOptions, compile_order, plan_run
from cutetune.tuner.tune import bucket_key

SHARES = (0.05, 0.25, 0.5)
BAND = 0.30  # the target
# The last seconds of a run are left out of the count outside the band: an ETA a few seconds
# off reads as 100% there.
TAIL_S = 20.0


@dataclass(frozen=True)
class _Workers:
    """What RunEta reads of a run's workers."""

    gpus: tuple[int, ...]
    compile_processes: int
    split: TimeSplit = field(default_factory=TimeSplit)


@dataclass(frozen=True)
class Replayed:
    """After the `done`-th trial, `elapsed_s` into the run: the replayed ETA, the ETA the run
    showed, and the true remaining time (seconds)."""

    done: int
    elapsed_s: float
    eta_s: float
    recorded_eta_s: float
    true_remaining_s: float

    @property
    def error(self) -> float:
        return self.eta_s / self.true_remaining_s - 1 if self.true_remaining_s > 0 else 0.0


def planned_run(model: str, tokens: Sequence[int], device: str, budget: int = DEFAULT_BUDGET
                ) -> tuple[list[PendingBucket], list[tuple[int, bool, Future]]]:
    """The run's buckets and compile queue (each distinct point one future), planned into an
    empty database on `device`'s datasheet ceilings."""
    spec = DEVICE_SPECS[device]
    units = model_units(model, "bfloat16")
    with tempfile.TemporaryDirectory(prefix="cutetune-eta-replay-") as directory:
        db = Database.open(f"sqlite:///{directory}/replay.db")
        fingerprint = DeviceFingerprint(device, "replay", spec.sm_count, "replay", "replay",
                                        "replay", "replay")
        _, pending = plan_run(units, sorted(set(tokens)), db, fingerprint, spec,
                              Ceilings.from_datasheet(spec), None, RunOptions(budget))
    futures: dict[tuple, Future] = {}
    queued = []
    for index, warm, points in compile_order(pending, budget):
        planned = pending[index].planned
        for point in points:
            key = (planned.kernel.name, planned.problem.static_key(), config_to_json(point))
            queued.append((index, warm, futures.setdefault(key, Future())))
    return pending, queued


def replay(pending: Sequence[PendingBucket], queued: Sequence[tuple[int, bool, Future]],
           readings: Sequence[dict], compiles: Sequence[dict], processes: int
           ) -> list[Replayed]:
    """The ETA after each recorded trial, the run's events played at their recorded moments
    (module docstring)."""
    now = [0.0]
    workers = _Workers((0,), processes)
    eta = RunEta.for_run(pending, queued, workers, clock=lambda: now[0], refresh_s=0.0)
    keys = {(key[0], key[1].static_key(), key[2]): key
            for key in (bucket_key(bucket.planned) for bucket in pending)}
    # Each kernel's compiles in the order they finished, to its points in queue order.
    by_kernel: dict[str, dict[Future, None]] = defaultdict(dict)
    for index, _, future in queued:
        by_kernel[pending[index].planned.kernel.name].setdefault(future)
    points = {kernel: list(futures) for kernel, futures in by_kernel.items()}
    finished = sorted((float(c["finished_at"]), float(c["seconds"]), c["kernel"])
                      for c in compiles)
    finishes, taken = deque(), defaultdict(int)
    for finished_at, seconds, kernel in finished:
        if taken[kernel] < len(points.get(kernel, ())):
            finishes.append((finished_at, seconds, points[kernel][taken[kernel]]))
            taken[kernel] += 1

    def at(moment: float) -> None:
        now[0] = moment
        while finishes and finishes[0][0] <= moment:
            _, seconds, future = finishes.popleft()
            future.set_result(CompileResult(None, seconds))

    out, current, last = [], None, 0.0
    for reading in readings:
        key = keys.get((reading["kernel"], reading["problem"], int(reading["bucket"])))
        if key is None:
            raise SystemExit(f"reading {reading['done']}'s bucket ({reading['kernel']} at "
                             f"{reading['bucket']} tokens, {reading['problem']}) is not one "
                             f"this plan has: was the run of another model, tokens or code?")
        elapsed = float(reading["elapsed_s"])
        if key != current:
            # The first bucket starts with the run; the others between their neighbours.
            at((last + elapsed) / 2 if current is not None else 0.0)
            if current is not None:
                eta.bucket_finished(current)
            eta.bucket_started(key)
            current = key
        at(elapsed)
        workers.split.verify_s = float(reading["gpu_busy_s"])
        workers.split.compile_wait_s = float(reading["compile_wait_s"])
        eta.trial(key)
        out.append(Replayed(int(reading["done"]), elapsed, eta.remaining_s(),
                            float(reading["eta_s"]), float(reading["true_remaining_s"])))
        last = elapsed
    return out


def at_shares(replayed: Sequence[Replayed], shares: Sequence[float] = SHARES
              ) -> list[Replayed]:
    """The first reading at or past each share of the trials."""
    total = len(replayed)
    return [next(r for r in replayed if r.done >= share * total) for share in shares]


def outside_band(replayed: Sequence[Replayed], band: float = BAND) -> list[Replayed]:
    """The readings from 5% of the trials, until TAIL_S before the end, whose ETA is more than
    `band` off the true remaining time."""
    start = SHARES[0] * len(replayed)
    return [r for r in replayed if r.done >= start and r.true_remaining_s > TAIL_S
            and abs(r.error) > band]


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the recorded run's model")
    parser.add_argument("--tokens", required=True, help="its token buckets, comma-separated")
    parser.add_argument("--device", required=True, choices=sorted(DEVICE_SPECS),
                        help="the recorded run's GPU (its datasheet ceilings)")
    parser.add_argument("--readings", type=Path, required=True, help="tune_eta --readings")
    parser.add_argument("--compiles", type=Path, required=True, help="tune_eta --compiles")
    parser.add_argument("--processes", type=int, default=12,
                        help="the recorded run's compile processes (its time line says)")
    parser.add_argument("--out", type=Path, help="CSV of every replayed reading")
    args = parser.parse_args()
    readings = _read(args.readings)
    if "bucket" not in readings[0]:
        raise SystemExit(f"{args.readings} has no bucket columns: it was recorded by a "
                         f"tune_eta older than eta_replay, and cannot be replayed")
    pending, queued = planned_run(args.model, [int(t) for t in args.tokens.split(",")],
                                  args.device)
    replayed = replay(pending, queued, readings, _read(args.compiles), args.processes)
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["done", "elapsed_s", "eta_s", "recorded_eta_s",
                             "true_remaining_s", "error_pct"])
            writer.writerows([r.done, round(r.elapsed_s, 2), round(r.eta_s, 1),
                              round(r.recorded_eta_s, 1), r.true_remaining_s,
                              round(100 * r.error, 1)] for r in replayed)
    for share, r in zip(SHARES, at_shares(replayed), strict=True):
        print(f"{share:4.0%} ({r.done}/{len(replayed)} trials, {r.elapsed_s:.0f} s in): "
              f"ETA {r.eta_s:.0f} s, true {r.true_remaining_s:.0f} s ({100 * r.error:+.0f}%); "
              f"the run showed {r.recorded_eta_s:.0f} s")
    outside = outside_band(replayed)
    worst = max(outside, key=lambda r: abs(r.error), default=None)
    print(f"outside the {BAND:.0%} band from 5% of the trials until {TAIL_S:.0f} s before the "
          f"end: {len(outside)} of {len(replayed)} readings"
          + (f"; the worst {100 * worst.error:+.0f}% at trial {worst.done} "
             f"({worst.true_remaining_s:.0f} s left)" if worst else ""))


if __name__ == "__main__":
    main()
