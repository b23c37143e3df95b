"""What `cutetune tune` shows while it runs and when it ends.

On stderr: one status line for the run (trials done of those planned, the run's ETA, the
bucket in hand, its trial k of n and best so far), drawn by tqdm and rewritten in place on a
terminal; a line per finished bucket. On stdout at the end: the summary table and where the
time went.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import click
from tqdm import tqdm

from cutetune.cli.table import render_table
from cutetune.device.specs import Ceilings
from cutetune.tuner.eta import RunEta
from cutetune.tuner.isolated import TimeSplit
from cutetune.tuner.model_run import BucketSummary, PendingBucket
from cutetune.tuner.study import TrialOutcome
from cutetune.tuner.tune import BucketPlan, bucket_key

# The head of the status line and of each finished bucket's line. The ETA is the run's own
# (tuner/eta.py), not tqdm's: trials differ too much for a rate of trials to foretell the rest.
STATUS = "[{n_fmt}/{total_fmt} trials, ETA {eta}] {desc}"


def _problem_label(problem) -> str:
    return " ".join(f"{k}={v}" for k, v in problem.static_fields().items())


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class _StatusLine(tqdm):
    """tqdm's line with the run's ETA as its `{eta}` field (tqdm's way to add a field)."""

    def __init__(self, *arguments: Any, eta_text, **options: Any):
        self._eta_text = eta_text
        super().__init__(*arguments, **options)

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "eta": self._eta_text()}


class RunProgress:
    """The model run's Observer; as a context manager it clears the status line at the end."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._bar: tqdm | None = None
        self._eta: RunEta | None = None
        # Trials done and expected of each bucket in hand (one per GPU worker).
        self._buckets: dict[tuple, list[int]] = {}

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()

    def started(self, fingerprint, ceilings: Ceilings, pending: Sequence[PendingBucket],
                skipped: int, eta: RunEta | None = None) -> None:
        self._eta = eta
        planned = sum(bucket.trials for bucket in pending)
        click.echo(f"{fingerprint.gpu_name} ({fingerprint.sm_count} SMs): copy ceiling "
                   f"{ceilings.copy_gbps:.0f} GB/s, launch floor {ceilings.launch_floor_us:.2f} us"
                   f"; {len(pending)} buckets to tune ({planned} trials at most), "
                   f"{skipped} stored already", file=self.stream)
        # On a log the status line is never drawn (its delay never passes): a line per trial
        # would bury the buckets' lines. tqdm still counts and times the trials for them.
        self._bar = _StatusLine(total=planned, file=self.stream, bar_format=STATUS,
                                mininterval=0, miniters=1, dynamic_ncols=True, leave=False,
                                delay=0 if self.live else math.inf, eta_text=self._eta_text)

    def eta_s(self) -> float | None:
        """The remaining seconds the status line shows (None before the run has an ETA)."""
        return self._eta.remaining_s() if self._eta is not None else None

    def _eta_text(self) -> str:
        seconds = self.eta_s()
        return _duration(seconds) if seconds is not None else "?"

    def bucket_started(self, planned: BucketPlan, expected_trials: int) -> None:
        self._buckets[bucket_key(planned)] = [0, expected_trials]

    def trial(self, planned: BucketPlan, outcome: TrialOutcome,
              best: TrialOutcome | None) -> None:
        counts = self._buckets[bucket_key(planned)]
        counts[0] += 1
        best_text = f"best {best.measurement.median_us:.2f} us" if best else "no point ok yet"
        self._bar.set_description_str(
            f"{planned.kernel.name} {_problem_label(planned.problem)} {planned.bucket} tokens: "
            f"trial {counts[0]} of {counts[1]}, {best_text}", refresh=False)
        self._bar.update()

    def bucket_finished(self, summary: BucketSummary) -> None:
        self._buckets.pop((summary.kernel, summary.problem, summary.bucket), None)
        if summary.median_us is not None:
            result = f"{summary.median_us:.2f} us"
        else:
            result = summary.status + (f" ({summary.note})" if summary.note else "")
        # The status line's head, whole (the status line itself is cut to the terminal).
        line = self._bar.format_meter(**{
            **self._bar.format_dict, "ncols": None,
            "prefix": f"{summary.kernel} {_problem_label(summary.problem)} {summary.bucket} "
                      f"tokens: {result}, {summary.trials} trials, {summary.failures} failed"})
        if self.live:  # above the status line, which tqdm draws again below it
            tqdm.write(line, file=self.stream)
        else:
            click.echo(line, file=self.stream)


def summary_table(rows: Sequence[BucketSummary]) -> str:
    """The run's summary: per problem and bucket, winner, time, % of the roofline (the copy
    ceiling for memory-bound kernels), speedup over the default, trials, failures."""
    header = ("kernel", "problem", "tokens", "status", "us", "% roof", "vs default", "trials",
              "failed", "winner")
    cells = [(row.kernel, _problem_label(row.problem), str(row.bucket),
              row.status + (f" ({row.note})" if row.note and row.median_us is None else ""),
              f"{row.median_us:.2f}" if row.median_us is not None else "-",
              f"{row.pct_roofline:.1f}" if row.pct_roofline is not None else "-",
              f"{row.speedup:.2f}x" if row.speedup is not None else "-",
              str(row.trials), str(row.failures),
              _config_label(row.winner_json) if row.winner_json else "-") for row in rows]
    return render_table(header, cells, right={"tokens", "us", "% roof", "vs default", "trials",
                                              "failed"})


def _config_label(config_json: str) -> str:
    import json

    return " ".join(f"{k}={v}" for k, v in json.loads(config_json).items())


def time_split_line(split: TimeSplit, compile_processes: int) -> str:
    workers, were = (("the GPU worker", "was") if split.gpus == 1
                     else (f"the {split.gpus} GPU workers (summed)", "were"))
    return (f"time: {_duration(split.wall_s)} wall; {workers} verified for "
            f"{split.verify_s:.0f} s, timed for {split.timing_s:.0f} s and {were} idle for "
            f"{split.gpu_idle_s:.0f} s ({split.compile_wait_s:.0f} s of it waiting for "
            f"compiles); compiles took {split.compile_cpu_s:.0f} s of CPU in "
            f"{compile_processes} processes; {split.workers_lost} workers lost")
