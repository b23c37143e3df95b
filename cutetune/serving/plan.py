"""The serving plan: which point serves each token bucket of a static problem.

Per bucket: the winner tuned there (the user's database first, then the winners shipped with
the package), else the nearest such bucket's winner where it is a valid point at this bucket,
else a winner of another problem of the kernel at this bucket, or where none lends of a kernel
it borrows from (borrowed: of the problems whose winner is a valid point here, the one the
calibrated model predicts fastest here, or without a calibration the one nearest in bytes
moved), else the device's calibrated cost model's pick (device/funnel.py `predicted_best`:
where `cutetune calibrate` fitted one), else the seed heuristic's default. Borrowed and
predicted points serve problems planned at warmup only: a miss on the call path costs no more
than reading its own winners.

Borrowing is the zero-shot rule the measurements favour ("Replayed searches" in BENCHMARKS.md:
the top pick of an untuned problem, borrowed where another problem lends a valid point).

A stored winner of the kernel's current source that today's space rejects (a bucket outside
the policy, a config a constraint now refuses) is not served; the plan keeps it with the
reason, so that the warmup and the report can say why. Planning compiles nothing: the
dispatcher, the bench, `cache build` and the report all read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import Lender, borrowed_pick, lenders_by_bucket
from cutetune.kernels.registry import KernelDef
from cutetune.kernels.stored import UnusablePoint, stored_point
from cutetune.serving.predicted import PredictedPicks
from cutetune.spaces.buckets import BUCKETS, bucket_index
from cutetune.spaces.problem import Problem

log = logging.getLogger("cutetune.serving")

TUNED, SHIPPED, NEAREST, BORROWED, PREDICTED, DEFAULT = (
    "tuned", "shipped", "nearest", "borrowed", "predicted", "default")


@dataclass(frozen=True)
class BucketEntry:
    bucket: int
    config: Any
    source: str  # TUNED (the user's database), SHIPPED (the package's), NEAREST, BORROWED,
    # PREDICTED or DEFAULT
    tuned_bucket: int | None
    lender: Lender | None = None  # BORROWED: the kernel and problem whose winner serves


@dataclass(frozen=True)
class RejectedWinner:
    """A stored winner of the kernel's current source that today's space rejects."""

    winner: Any  # the results_db Winner record
    source: str  # TUNED or SHIPPED
    reason: UnusablePoint


def nearest_tuned(bucket: int, tuned: Sequence[int]) -> int | None:
    """The tuned bucket closest in log2 distance (ties go to the larger, the safer grid)."""
    if not tuned:
        return None
    return min(tuned, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), -b))


class ServingPlan:
    def __init__(self, spec, winners: Iterable[Any] = (), shipped: Iterable[Any] = (),
                 on_rejected: Callable[[KernelDef, Problem, RejectedWinner], None] | None = None,
                 calibrated: CalibratedModel | None = None, picks_file: Path | None = None):
        """`spec`: the DeviceSpec the points are planned for; `winners`: results_db Winner
        records this device may serve (results_db.winners_to_serve); `shipped`: the winners
        shipped with the package (results_db.shipped_winners), served where `winners` has none
        for the bucket; `on_rejected` is told of each rejected winner once, when its problem is
        first planned; `calibrated`: the device's calibrated cost model (None: the heuristic
        default serves what nothing tuned covers), whose picks are remembered in `picks_file`
        (serving/predicted.py; None: in this process only) once `save_picks` is called."""
        self.spec = spec
        self.calibrated = calibrated
        self._picks = (None if calibrated is None
                       else PredictedPicks(calibrated, spec, picks_file))
        # Every stored winner, stale ones included: which are current depends on the kernel's
        # source, known only when a kernel is planned.
        self.winners = _by_problem(winners)
        self.shipped = _by_problem(shipped)
        self._on_rejected = on_rejected
        # Planned once per static problem (and whether it is planned at warmup): the winners
        # do not change.
        self._planned: dict[tuple[str, str, bool], tuple[BucketEntry, ...]] = {}
        self._rejected: dict[tuple[str, str], tuple[RejectedWinner, ...]] = {}
        self._lenders: dict[str, dict[int, dict[Lender, Any]]] = {}

    def entries(self, kernel: KernelDef, problem: Problem,
                at_warmup: bool = True) -> tuple[BucketEntry, ...]:
        """What serves each bucket of BUCKETS for `problem`'s static part; without
        `at_warmup`, the heuristic default stands in for borrowed points and the calibrated
        model's picks (a miss on the call path: looking beyond its own winners would cost the
        call)."""
        key = (kernel.name, problem.static_key(), at_warmup)
        if key not in self._planned:
            self._planned[key] = self._plan(kernel, problem.with_tokens(1), key[2])
        return self._planned[key]

    def entry_for(self, kernel: KernelDef, problem: Problem) -> BucketEntry:
        """What serves a call of `problem` at its token count."""
        return self.entries(kernel, problem)[bucket_index(problem.num_tokens)]

    def save_picks(self) -> None:
        """Keep the calibrated model's picks worked out so far for the next start."""
        if self._picks is not None:
            self._picks.save()

    def rejected(self, kernel: KernelDef, problem: Problem) -> tuple[RejectedWinner, ...]:
        """The stored winners of `problem`'s static part that today's space rejects."""
        self.entries(kernel, problem)
        return self._rejected[(kernel.name, problem.static_key())]

    def _current(self, winners: dict[tuple[str, str], list[Any]], source: str,
                 kernel: KernelDef, problem: Problem,
                 rejected: list[RejectedWinner]) -> dict[int, Any]:
        """The configs of `winners` for this kernel's current source and problem, by bucket;
        those today's space rejects go to `rejected`."""
        current = kernel.source_hash()
        configs = {}
        for w in winners.get((kernel.name, problem.static_key()), ()):
            if w.source_hash != current:
                continue
            try:
                point = stored_point(kernel, w.static_key, w.bucket, w.config_json, self.spec)
            except UnusablePoint as why:
                rejected.append(RejectedWinner(w, source, why))
                if self._on_rejected is not None:
                    self._on_rejected(kernel, problem, rejected[-1])
                continue
            configs[w.bucket] = point.config
        return configs

    def _plan(self, kernel: KernelDef, problem: Problem,
              at_warmup: bool) -> tuple[BucketEntry, ...]:
        rejected: list[RejectedWinner] = []
        yours = self._current(self.winners, TUNED, kernel, problem, rejected)
        shipped = self._current(self.shipped, SHIPPED, kernel, problem, rejected)
        self._rejected[(kernel.name, problem.static_key())] = tuple(rejected)
        tuned = {**shipped, **yours}
        tuned_buckets = sorted(tuned)
        picks = None  # worked out where a bucket needs them: a tuned problem needs none
        entries = []
        for index, bucket in enumerate(BUCKETS):
            at_bucket = problem.with_tokens(bucket)
            if bucket in tuned:
                entries.append(BucketEntry(bucket, tuned[bucket],
                                           TUNED if bucket in yours else SHIPPED, bucket))
                continue
            near = nearest_tuned(bucket, tuned_buckets)
            if near is not None and kernel.space.first_violation(
                    at_bucket, tuned[near], self.spec) is None:
                entries.append(BucketEntry(bucket, tuned[near], NEAREST, near))
            elif at_warmup and (lent := borrowed_pick(
                    kernel, at_bucket, self.spec, self._lenders_of(kernel).get(bucket, {}),
                    self.calibrated)):
                entries.append(BucketEntry(bucket, lent[1], BORROWED, None, lent[0]))
            elif at_warmup and self._picks is not None:
                picks = picks or self._picks.for_problem(kernel, problem)
                entries.append(BucketEntry(bucket, picks[index], PREDICTED, None))
            else:
                entries.append(BucketEntry(bucket, kernel.default_config(at_bucket, self.spec),
                                           DEFAULT, None))
        return tuple(entries)

    def _lenders_of(self, kernel: KernelDef) -> dict[int, dict[Lender, Any]]:
        """The current winners of every problem of `kernel` and of the kernels it borrows
        from, by bucket and lender (the user's over the shipped ones)."""
        if kernel.name not in self._lenders:
            self._lenders[kernel.name] = lenders_by_bucket(kernel, [
                w for winners in (self.shipped, self.winners)
                for stored in winners.values() for w in stored], self.spec)
        return self._lenders[kernel.name]


def say_skipped(kernel: KernelDef, problem: Problem, rejected: RejectedWinner) -> None:
    """One line for a stored winner the plan does not serve (an `on_rejected`)."""
    log.warning("cutetune: skipping a stored %s winner (bucket %s, %s): %s", kernel.name,
                rejected.winner.bucket, " ".join(
                    f"{k}={v}" for k, v in problem.static_fields().items()), rejected.reason)


def _by_problem(winners: Iterable[Any]) -> dict[tuple[str, str], list[Any]]:
    """Winners grouped by (kernel, static key)."""
    grouped: dict[tuple[str, str], list[Any]] = {}
    for w in winners:
        grouped.setdefault((w.kernel_name, w.static_key), []).append(w)
    return grouped
