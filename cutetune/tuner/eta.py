"""How long a tuning run has left (the ETA `cutetune tune` shows, cli/progress.py).

A run's time goes three ways, and the number of trials left says little about how:
- compiles: a point's artifact serves every bucket of its static problem, so each problem's
  first buckets pay for most of them, while the compile pool works through its queue in
  parallel (build/compile_pool.py); a trial whose point is not compiled yet waits for it;
- the GPU worker verifying and timing each point: by the measurement protocol
  (device/measure.py) about the same per trial whatever the size, as each graph is sized to a
  target time, and more for a decode-sized point, which is timed between two timings of a
  reference, and for a bucket's first trial, which also makes the bucket's inputs;
- the tuner between trials and around buckets: Optuna in the results database, the worker's
  replies, the finalists' re-measurement, the store;
and the run ends once the pool has compiled everything queued ahead, needed or not.
A mean rate since the start charges every trial left with the pool's start-up and the first
buckets' compiles: the first ETA of a whole-model run said 48m42s for a run of about 7 minutes.

Before the first trial the estimate comes from what is known: per pending bucket, the trials
it takes, the roofline's predicted time of its best-ranked candidates priced by the
measurement protocol, and its points' compiles in the pool's queue (a point stored already
costs nothing, nor does a stored bucket, which is not pending). The rest of the run is then
played forward: each GPU worker takes the next bucket left, each trial waits for its point
where the pool will not have compiled it by then, then takes the GPU and the tuner's time.
As trials finish, each part's rate is learned from its own measurement (each compile's
seconds, the workers' verify and timing seconds, the wall clock for the rest), blended with
the prior, per kernel where that kernel has been measured.
"""

from __future__ import annotations

import heapq
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cutetune.device.measure import (
    DRIFT_CORRECTED_BELOW_US,
    MAX_LAUNCHES_PER_GRAPH,
    REPEATS,
    TARGET_GRAPH_US,
    WARMUP_REPLAYS,
    input_sets_for,
)
from cutetune.tuner.finals import FINAL_DRAWS
from cutetune.tuner.tune import BucketPlan, bucket_key

if TYPE_CHECKING:
    from cutetune.tuner.isolated import Workers
    from cutetune.tuner.model_run import BucketSummary, Observer, PendingBucket

# The prior: what each part costs before the run has measured it, as measured on the H200's and
# an H100's hosts. The run corrects each within its first buckets, so these matter most for the
# first ETA.
COMPILE_S = 2.0  # a point compiled, exported and linked (0.7-6 s on the 2-core dev machine)
POOL_START_S = 8.0  # a compile process's start-up (torch, CuTeDSL and the kernels imported)
# The tuner per trial beyond the worker's verify and timing (Optuna's ask and tell in the
# results database, heartbeats, the worker's reply), more for a trial TPE proposes than for
# one the warm start enqueued (TPE's sampling), and per bucket (its study opened, its input
# sets made, its trials and winner stored). Fitted by least squares to the 64 buckets of a
# Kimi-K2 config's run on an H100 (the time outside the GPU and the compile waits; the median
# bucket's error 15%): an enqueued trial 0.03 s, a proposal 0.09 s more, a bucket 0.25 s.
# Whole-model runs on the H200 spent about 0.12 s a trial in all.
TRIAL_OVERHEAD_S = 0.03
PROPOSAL_OVERHEAD_S = 0.09
BUCKET_OVERHEAD_S = 0.25
# After its last bucket's winner is stored, the run stops its GPU worker and compile processes
# and checks every study for trials left RUNNING: 2.5 s after the last trial of that H100 run.
RUN_END_S = 2.5
VERIFY_S = 0.005  # a point verified, besides the reference's bytes (below)
# A bucket's first trial also makes the bucket's input sets and loads and times the reference
# point (tuner/trials.py): beyond its predicted time, the first trials of that H100 run took
# the GPU worker 0.26-0.97 s more (p10-p90; median 0.40 s), some 14% of the run.
FIRST_TRIAL_S = 0.4
HOST_US_PER_LAUNCH = 12.0  # a launch of the timing loop on the host (fresh outputs, the call)
GRAPH_FIXED_US = 3000.0  # a graph captured and instantiated, each repeat synchronised
# The prior weighs as much as this many measured trials (compiles: this many compiles).
PRIOR_TRIALS = 4
PRIOR_COMPILES = 4
REFRESH_S = 1.0  # the estimate is played forward again at most this often
# A bucket's finalists and its default, re-measured side by side (tuner/study.py) on
# FINAL_DRAWS draws of inputs, priced as this many timings per draw.
REMEASURED = 4


def timing_s(predicted_us: float, input_sets: int) -> float:
    """Seconds one timing of device/measure.py (`time_in_graph`) takes for a point predicted at
    `predicted_us` a call over `input_sets` input sets: the graph is sized by a probe whose
    per-call time a decode-sized launch spends on the host, then replayed WARMUP_REPLAYS +
    REPEATS times."""
    per_call = max(predicted_us, HOST_US_PER_LAUNCH)
    launches = min(MAX_LAUNCHES_PER_GRAPH,
                   max(input_sets, math.ceil(TARGET_GRAPH_US / per_call)))
    launches = math.ceil(launches / input_sets) * input_sets
    replayed_us = (WARMUP_REPLAYS + REPEATS) * launches * predicted_us
    host_us = (launches + 4 * input_sets) * HOST_US_PER_LAUNCH  # captured; warm-up and probe
    return (GRAPH_FIXED_US + replayed_us + host_us) * 1e-6


def trial_busy_s(predicted_us: float, input_sets: int, bytes_moved: int,
                 copy_gbps: float) -> float:
    """The GPU worker's seconds verifying and timing one trial: a decode-sized point (under
    DRIFT_CORRECTED_BELOW_US) is timed, then timed again between two timings of the reference
    (tuner/trials.py); the fp32 reference moves about four times the kernel's bytes."""
    timings = 4 if predicted_us < DRIFT_CORRECTED_BELOW_US else 1
    return (VERIFY_S + 4 * bytes_moved / (copy_gbps * 1e9)
            + timings * timing_s(predicted_us, input_sets))


@dataclass(frozen=True)
class BucketWork:
    """What one pending bucket will cost, as known before it starts. `warm` are the compiles of
    its warm start, in the order its first trials take them; `others` those of its other
    candidates, among which TPE proposes the rest of its trials."""

    key: tuple
    kernel: str
    trials: int
    trial_busy_s: float  # predicted GPU worker seconds per trial
    finalists_busy_s: float  # predicted GPU worker seconds re-measuring its finalists
    warm: tuple[Future, ...] = ()
    others: tuple[Future, ...] = ()


def bucket_work(planned: BucketPlan, trials: int, warm: Sequence[Future] = (),
                others: Sequence[Future] = ()) -> BucketWork:
    """The prior of one bucket: its trials priced at the mean predicted time of its best-ranked
    `trials` candidates, over the input sets its worker makes (GpuTrialRunner's rule)."""
    kept = planned.plan.kept[:max(trials, 1)]
    predicted_us = sum(p.prediction.predicted_us for p in kept) / len(kept)
    bytes_moved = planned.kernel.cost(planned.problem, planned.default,
                                      planned.spec).bytes_moved
    sets = input_sets_for(bytes_moved, planned.spec.l2_bytes)
    return BucketWork(bucket_key(planned), planned.kernel.name, trials,
                      trial_busy_s(predicted_us, sets, bytes_moved,
                                   planned.ceilings.copy_gbps),
                      (min(trials, REMEASURED) * FINAL_DRAWS if trials > 1 else 0)
                      * timing_s(predicted_us, sets), tuple(warm), tuple(others))


def _distinct(futures: Iterable[Future]) -> list[Future]:
    return list(dict.fromkeys(futures))


class _Bucket:
    """What the run has told of one bucket so far."""

    def __init__(self, work: BucketWork):
        self.work = work
        self.done = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None

    @property
    def in_hand(self) -> bool:
        return self.started_at is not None and self.finished_at is None


class RunEta:
    """The remaining time of one run, kept current by the run's events (`updating`).

    `work`: the pending buckets in the order the workers take them; `queue`: the compiles
    queued ahead, in the pool's order; `measured()`: the GPU workers' verify plus timing seconds
    and the seconds trials waited for compiles, each summed since the run started (TimeSplit)."""

    def __init__(self, work: Sequence[BucketWork], queue: Sequence[Future], gpus: int,
                 compile_processes: int, measured: Callable[[], tuple[float, float]],
                 clock: Callable[[], float] = time.monotonic, refresh_s: float = REFRESH_S):
        self._buckets = {w.key: _Bucket(w) for w in work}
        self._order = list(self._buckets.values())
        self._queue = _distinct(queue)
        self._kernel_of: dict[Future, str] = {}
        for w in work:
            for future in (*w.warm, *w.others):
                self._kernel_of.setdefault(future, w.kernel)
        self._gpus = max(1, gpus)
        self._processes = max(1, compile_processes)
        self._measured = measured
        self._clock = clock
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self.started_at = clock()
        self._busy_seen, self._wait_seen = measured()
        self._busy_by_kernel: dict[str, float] = {}
        self._wait_by_kernel: dict[str, float] = {}
        # The started buckets' first trials (FIRST_TRIAL_S): their GPU worker seconds per
        # kernel, and each one's seconds beyond its predicted time.
        self._first_busy_by_kernel: dict[str, float] = {}
        self._first_excess: list[float] = []
        # Compiles not seen finished yet; the seconds of those that ran, per kernel.
        self._unseen = [f for f in self._queue if not f.done()]
        self._compiled: dict[str, list[float]] = {}
        self._estimate: float | None = None
        self._estimate_at = 0.0

    @classmethod
    def for_run(cls, pending: Sequence[PendingBucket],
                queued: Sequence[tuple[int, bool, Future]], workers: Workers,
                clock: Callable[[], float] = time.monotonic,
                refresh_s: float = REFRESH_S) -> RunEta:
        """The ETA of a run of `pending` on `workers`; `queued`: what model_run queued ahead,
        as (index of the bucket in `pending`, in its warm start, the compile's future), in the
        pool's order."""
        warm: list[list[Future]] = [[] for _ in pending]
        others: list[list[Future]] = [[] for _ in pending]
        for index, in_warm_start, future in queued:
            (warm if in_warm_start else others)[index].append(future)
        work = []
        for bucket, its_warm, its_others in zip(pending, warm, others, strict=True):
            its_warm = _distinct(its_warm)
            seen = set(its_warm)
            work.append(bucket_work(bucket.planned, bucket.trials, its_warm,
                                    [f for f in _distinct(its_others) if f not in seen]))
        split = workers.split
        return cls(work, [f for _, _, f in queued], len(workers.gpus),
                   workers.compile_processes,
                   lambda: (split.verify_s + split.timing_s, split.compile_wait_s),
                   clock, refresh_s)

    @property
    def buckets(self) -> tuple[tuple, ...]:
        """The keys of the buckets it counts (the pending ones), in the order they are taken."""
        return tuple(b.work.key for b in self._order)

    def updating(self, observer: Observer) -> _Updating:
        """`observer`, with this ETA told of each event before it."""
        return _Updating(self, observer)

    # The run's events.
    def bucket_started(self, key: tuple) -> None:
        with self._lock:
            self._attribute(key)
            if key in self._buckets:
                self._buckets[key].started_at = self._clock()

    def trial(self, key: tuple) -> None:
        with self._lock:
            bucket = self._buckets.get(key)
            self._attribute(key, first_trial=bucket is not None and bucket.done == 0)
            if bucket is not None:
                bucket.done += 1

    def bucket_finished(self, key: tuple) -> None:
        with self._lock:
            self._attribute(key)
            if key in self._buckets:
                self._buckets[key].finished_at = self._clock()
            self._estimate = None

    def _attribute(self, key: tuple, first_trial: bool = False) -> None:
        """The GPU work and the compile waits measured since the last event, to the kernel of
        the bucket it came from (with several GPU workers, to the one whose event comes
        first); a bucket's first trial's GPU work is also kept apart (FIRST_TRIAL_S)."""
        busy, wait = self._measured()
        bucket = self._buckets.get(key)
        if bucket is not None:
            kernel = bucket.work.kernel
            gpu = busy - self._busy_seen
            if first_trial:
                self._first_busy_by_kernel[kernel] = (self._first_busy_by_kernel.get(kernel, 0.0)
                                                      + gpu)
                self._first_excess.append(gpu - bucket.work.trial_busy_s)
            self._busy_by_kernel[kernel] = self._busy_by_kernel.get(kernel, 0.0) + gpu
            self._wait_by_kernel[kernel] = (self._wait_by_kernel.get(kernel, 0.0)
                                            + wait - self._wait_seen)
        self._busy_seen, self._wait_seen = busy, wait

    def remaining_s(self) -> float:
        """Seconds until the run's last bucket is stored, as estimated now."""
        with self._lock:
            now = self._clock()
            if self._estimate is None or now - self._estimate_at >= self._refresh_s:
                self._estimate, self._estimate_at = self._played_forward(now), now
            return max(0.0, self._estimate - (now - self._estimate_at))

    # The estimate.
    def _compile_rates(self) -> tuple[dict[str, float], float]:
        """Seconds a compile takes, per kernel and over the run: the median of the finished
        compiles that ran (a stored point's took none; a process's first compile also imports
        CuTeDSL, which the median leaves out), blended with the prior by their number."""
        unseen = []
        for future in self._unseen:
            if not future.done():
                unseen.append(future)
            elif future.exception() is None and future.result().seconds > 0:
                self._compiled.setdefault(self._kernel_of.get(future, ""), []).append(
                    future.result().seconds)
        self._unseen = unseen

        def blended(prior: float, seconds: list[float]) -> float:
            if not seconds:
                return prior
            return ((PRIOR_COMPILES * prior + len(seconds) * statistics.median(seconds))
                    / (PRIOR_COMPILES + len(seconds)))

        overall = blended(COMPILE_S, [t for s in self._compiled.values() for t in s])
        return {kernel: blended(overall, s) for kernel, s in self._compiled.items()}, overall

    def _busy_scales(self) -> tuple[dict[str, float], float]:
        """Measured GPU worker seconds over predicted, of the trials after each bucket's first
        (FIRST_TRIAL_S), per kernel measured (blended with the prior's 1 by its trials), and
        for a kernel not measured yet: `_unmeasured` (one kernel's heavy reference says little
        of the next kernel's)."""
        predicted: dict[str, float] = {}
        trials: dict[str, int] = {}
        for bucket in self._order:
            work = bucket.work
            after_first = max(0, bucket.done - 1)
            seconds = after_first * work.trial_busy_s
            if bucket.finished_at is not None:
                seconds += work.finalists_busy_s
            predicted[work.kernel] = predicted.get(work.kernel, 0.0) + seconds
            trials[work.kernel] = trials.get(work.kernel, 0) + after_first
        measured = {kernel: _blend(1.0, self._busy_by_kernel.get(kernel, 0.0)
                                   - self._first_busy_by_kernel.get(kernel, 0.0), seconds,
                                   trials[kernel])
                    for kernel, seconds in predicted.items() if trials[kernel]}
        return measured, _unmeasured(measured)

    def _first_trial_s(self) -> float:
        """A bucket's first trial's GPU worker seconds beyond its predicted time: the median
        over the buckets started, blended with the prior by their number."""
        if not self._first_excess:
            return FIRST_TRIAL_S
        started = len(self._first_excess)
        return ((PRIOR_TRIALS * FIRST_TRIAL_S + started * statistics.median(self._first_excess))
                / (PRIOR_TRIALS + started))

    def _overhead_scales(self, now: float) -> tuple[dict[str, float], float]:
        """The tuner's measured time (its buckets' wall time less their GPU work and compile
        waits) over the prior's, per kernel measured (blended with the prior's 1 by its
        trials); for a kernel not measured yet, the geometric mean of those and of the prior's
        1. The time outside the GPU is the run's own (Optuna, the store) plus the kernel's host
        work (its reference, its inputs), which is the kernel's: moe_dispatch's took three to
        five times the kernels after it on the H200, and a run's average would price their
        trials at its rate; the smallest rate would let a kernel of few trials, none of them
        proposed, price every kernel after it short."""
        walls: dict[str, float] = {}
        predicted: dict[str, float] = {}
        trials: dict[str, int] = {}
        for bucket in self._order:
            if bucket.started_at is None:
                continue
            kernel = bucket.work.kernel
            walls[kernel] = walls.get(kernel, 0.0) + (bucket.finished_at or now) - bucket.started_at
            predicted[kernel] = predicted.get(kernel, 0.0) + (
                TRIAL_OVERHEAD_S * bucket.done
                + PROPOSAL_OVERHEAD_S * max(0, bucket.done - len(bucket.work.warm))
                + BUCKET_OVERHEAD_S * (1.0 if bucket.finished_at is not None
                                       else 0.5 if bucket.in_hand else 0.0))
            trials[kernel] = trials.get(kernel, 0) + bucket.done
        measured = {
            kernel: _blend(1.0, max(0.0, wall - self._busy_by_kernel.get(kernel, 0.0)
                                    - self._wait_by_kernel.get(kernel, 0.0)),
                           predicted[kernel], trials[kernel])
            for kernel, wall in walls.items() if trials[kernel]}
        return measured, _unmeasured(measured)

    def _played_forward(self, now: float) -> float:
        compile_s, compile_overall = self._compile_rates()
        busy_scale, busy_overall = self._busy_scales()
        overhead_scale, overhead_unmeasured = self._overhead_scales(now)
        first_trial_s = self._first_trial_s()
        waiting = [f for f in self._queue if not f.done()]
        # Before its first compile the pool is starting up.
        started = any(self._compiled.values()) or not waiting
        pool_start = 0.0 if started else max(0.0, POOL_START_S - (now - self.started_at))
        # When the pool, taking its queue in order with every process, will have compiled each
        # point still waiting (from now).
        ready: dict[Future, float] = {}
        queued_s = 0.0
        for future in waiting:
            seconds = compile_s.get(self._kernel_of.get(future, ""), compile_overall)
            ready[future] = pool_start + queued_s / self._processes + seconds
            queued_s += seconds

        def play(bucket: _Bucket, t: float) -> float:
            """When `bucket` ends if its worker goes on with it at `t`."""
            work = bucket.work
            compile_one = compile_s.get(work.kernel, compile_overall)
            overhead = overhead_scale.get(work.kernel, overhead_unmeasured)
            per_trial = (busy_scale.get(work.kernel, busy_overall) * work.trial_busy_s
                         + overhead * TRIAL_OVERHEAD_S)
            per_proposal = per_trial + overhead * PROPOSAL_OVERHEAD_S

            def wait(future: Future, t: float) -> float:
                # A point asked for goes ahead of the queue: it waits one compile at most.
                if future not in ready:
                    return 0.0
                return max(0.0, min(ready[future], max(t, pool_start) + compile_one) - t)

            left = max(0, work.trials - bucket.done)
            if bucket.done == 0 and left:
                t += first_trial_s
            warm = work.warm[bucket.done:bucket.done + left]  # its warm start comes first
            for future in warm:
                t += wait(future, t) + per_trial
            proposed = left - len(warm)
            if proposed:
                # TPE's proposals: any of its other candidates, compiled or not by then.
                asked_done = max(t, pool_start) + compile_one
                late = sum(max(0.0, min(ready[f], asked_done) - t)
                           for f in work.others if f in ready)
                t += proposed * (late / max(1, len(work.others)) + per_proposal)
            return t + (busy_scale.get(work.kernel, busy_overall) * work.finalists_busy_s
                        + overhead * BUCKET_OVERHEAD_S * (0.5 if bucket.in_hand else 1.0))

        ends = [play(b, 0.0) for b in self._order if b.in_hand]
        workers = ends + [0.0] * max(0, self._gpus - len(ends))
        heapq.heapify(workers)
        for bucket in self._order:
            if bucket.started_at is None:
                heapq.heappush(workers, play(bucket, heapq.heappop(workers)))
        # The run ends once the pool has compiled all it was queued: closing it lets each
        # process finish the queue first (compile_pool.py), which fills the artifact cache.
        end = max(*workers, *ready.values(), 0.0)
        return end + RUN_END_S if any(b.finished_at is None for b in self._order) else end


def _unmeasured(measured: dict[str, float]) -> float:
    """The rate of a kernel not measured yet, from those of the kernels measured: their
    geometric mean with the prior's 1, as kernels differ (the prior's 1 before any)."""
    return math.exp(sum(math.log(max(scale, 1e-6)) for scale in measured.values())
                    / (1 + len(measured)))


def _blend(prior: float, measured: float, predicted: float, trials: int) -> float:
    """The ratio `measured` / `predicted` of `trials` trials, blended with the prior's."""
    if predicted <= 0 or trials <= 0:
        return prior
    return (PRIOR_TRIALS * prior + trials * measured / predicted) / (PRIOR_TRIALS + trials)


class _Updating:
    """An Observer that tells the ETA of each event, then `observer`."""

    def __init__(self, eta: RunEta, observer: Observer):
        self._eta = eta
        self._observer = observer

    def started(self, *arguments: Any) -> None:
        self._observer.started(*arguments)

    def bucket_started(self, planned: BucketPlan, expected_trials: int) -> None:
        self._eta.bucket_started(bucket_key(planned))
        self._observer.bucket_started(planned, expected_trials)

    def trial(self, planned: BucketPlan, outcome: Any, best: Any) -> None:
        self._eta.trial(bucket_key(planned))
        self._observer.trial(planned, outcome, best)

    def bucket_finished(self, summary: BucketSummary) -> None:
        self._eta.bucket_finished((summary.kernel, summary.problem, summary.bucket))
        self._observer.bucket_finished(summary)
