"""The run's ETA (tuner/eta.py), on runs played on a fake clock: a compile pool taking its queue
in order (a point a trial waits for first) and GPU workers taking the buckets in order, with
true costs that differ from the ETA's prior. Each test checks the ETA against the true
remaining time, and where the old ETA (the mean rate of trials since the start) would pass
too, against that as well, so each can fail."""

from __future__ import annotations

import heapq
import random
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from cutetune.build.compile_pool import CompileResult
from cutetune.kernels import qk_norm as qk
from cutetune.results_db import Database
from cutetune.spaces.models import load_model
from cutetune.tuner.eta import BucketWork, RunEta, bucket_work, timing_s, trial_busy_s
from cutetune.tuner.model_run import RunOptions, tune_model
from cutetune.tuner.study_storage import open_storage
from cutetune.tuner.tune import plan_bucket
from testkit.fake_qk_runner import CEILINGS, SPEC
from testkit.fault_kernel import FaultProblem
from testkit.fault_run import fault_workers
from testkit.sound_fault_points import UNITS, sound_points_only


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Truth:
    """What each part of a played run really takes."""

    compile_s: float = 3.0
    pool_start_s: float = 12.0
    first_compile_s: float = 0.0  # more for a process's first compile (it imports CuTeDSL)
    busy_s: dict[str, float] = field(default_factory=dict)  # per trial, by kernel
    # The tuner's time as fitted to a whole-model run on an H100 (eta.py's prior).
    overhead_s: float = 0.03  # per trial
    proposal_s: float = 0.09  # more for a trial TPE proposes (past the warm start)
    overhead_by_kernel_s: dict[str, float] = field(default_factory=dict)  # per trial, by kernel
    bucket_s: float = 0.25  # per bucket, half before its first trial, half after its last
    remeasure_s: float = 0.2
    # More for a bucket's first trial (its inputs made, its reference timed), as on that H100.
    first_trial_s: float = 0.4
    run_end_s: float = 2.5  # after the last bucket: the workers and the pool stopped


@dataclass(frozen=True)
class Problem:
    """A kernel's static problem in a played run: its candidates (shared by its buckets, as
    artifacts are) and its buckets' (trials, warm start size)."""

    kernel: str
    candidates: int
    buckets: tuple[tuple[int, int], ...]
    prior_busy_s: float = 0.06


@dataclass
class Reading:
    at: float
    done: int
    eta_s: float


class PlayedRun:
    def __init__(self, problems, truth: Truth, processes: int = 12, gpus: int = 1,
                 stored=frozenset(), seed: int = 0):
        self.truth = truth
        self.clock = Clock()
        self.processes = processes
        self.busy = self.wait = 0.0
        rng = random.Random(seed)
        self.work: list[BucketWork] = []
        self.points: dict[tuple, list[Future]] = {}  # a bucket's points in the order it takes
        queue_warm, queue_others = [], []
        for problem in problems:
            futures = [Future() for _ in range(problem.candidates)]
            for index in stored:  # points the artifact store holds from an earlier run
                if index < problem.candidates:
                    futures[index].set_result(CompileResult(None, 0.0))
            for bucket, (trials, warm_size) in enumerate(problem.buckets):
                start = bucket % 3  # each bucket's ranking differs a little
                ranked = futures[start:] + futures[:start]
                warm, others = ranked[:warm_size], ranked[warm_size:]
                key = (problem.kernel, bucket)
                self.work.append(BucketWork(key, problem.kernel, trials, problem.prior_busy_s,
                                            4 * 0.02, tuple(warm), tuple(others)))
                self.points[key] = warm + rng.sample(others, max(0, trials - len(warm)))
                queue_warm += warm
                queue_others += others
        self.queue = list(dict.fromkeys(queue_warm + queue_others))
        self.kernel_of = {f: w.kernel for w in self.work for f in (*w.warm, *w.others)}
        self.eta = RunEta(self.work, self.queue, gpus, processes,
                          lambda: (self.busy, self.wait), clock=self.clock, refresh_s=0.0)
        self.gpus = gpus
        self.total = sum(w.trials for w in self.work)
        self.readings: list[Reading] = []
        self.end = None
        # The pool: each process's next free moment; when each point is compiled.
        self._free = [(truth.pool_start_s, p) for p in range(processes)]
        self._first = set(range(processes))  # processes yet to compile
        self._seconds: dict[Future, float] = {}
        self._compiled_at: dict[Future, float] = {
            f: 0.0 for f in self.queue if f.done()}
        self._next = 0

    def _compile(self, future: Future, not_before: float = 0.0) -> None:
        start, process = heapq.heappop(self._free)
        seconds = self.truth.compile_s
        if process in self._first:
            self._first.discard(process)
            seconds += self.truth.first_compile_s
        self._compiled_at[future] = max(start, not_before) + seconds
        self._seconds[future] = seconds
        heapq.heappush(self._free, (self._compiled_at[future], process))

    def _take_queue_until(self, t: float) -> None:
        while self._next < len(self.queue) and self._free[0][0] <= t:
            future = self.queue[self._next]
            self._next += 1
            if future not in self._compiled_at:
                self._compile(future)

    def _ask(self, future: Future, t: float) -> float:
        self._take_queue_until(t)
        if future not in self._compiled_at:  # asked for: ahead of the queue
            self._compile(future, not_before=t)
        return self._compiled_at[future]

    def _at(self, t: float) -> None:
        """The clock moves to `t`; compiles finished by then are told."""
        self._take_queue_until(t)
        self.clock.now = t
        for future, done in self._compiled_at.items():
            if done <= t and not future.done():
                future.set_result(CompileResult(None, self._seconds[future]))

    def play(self) -> PlayedRun:
        """Buckets to the GPU workers in order, each to the first worker free (the workers'
        events in time order, as the run's lock serialises them)."""
        events = []  # (time, order, kind, key)
        free = [(0.0, g) for g in range(self.gpus)]
        order = 0
        for work in self.work:
            t, gpu = heapq.heappop(free)
            events.append((t, order, "started", work.key))
            order += 1
            t += self.truth.bucket_s / 2
            for index, future in enumerate(self.points[work.key][:work.trials]):
                waited = max(0.0, self._ask(future, t) - t)
                busy = self.truth.busy_s.get(work.kernel, 0.05)
                if index == 0:
                    busy += self.truth.first_trial_s
                t += waited + busy + self.truth.overhead_by_kernel_s.get(
                    work.kernel, self.truth.overhead_s)
                if index >= len(work.warm):
                    t += self.truth.proposal_s
                events.append((t, order, "trial", work.key, busy, waited))
                order += 1
            t += self.truth.remeasure_s + self.truth.bucket_s / 2
            events.append((t, order, "finished", work.key, self.truth.remeasure_s, 0.0))
            order += 1
            heapq.heappush(free, (t, gpu))
        done = 0
        for event in sorted(events):
            t, _, kind, key, *measured = event
            self._at(t)
            if measured:
                self.busy += measured[0]
                self.wait += measured[1]
            if kind == "started":
                self.eta.bucket_started(key)
            elif kind == "trial":
                self.eta.trial(key)
                done += 1
                self.readings.append(Reading(t, done, self.eta.remaining_s()))
            else:
                self.eta.bucket_finished(key)
        # The pool's close lets it compile all it was queued first.
        self._take_queue_until(float("inf"))
        self.end = max(max(t for t, *_ in events) + self.truth.run_end_s,
                       *(t for t, _ in self._free))
        return self

    def at_share(self, share: float) -> tuple[float, float, float]:
        """At the first trial with `share` of the trials done: the ETA, the old mean-rate ETA,
        the true remaining time."""
        reading = next(r for r in self.readings if r.done >= share * self.total)
        mean_rate = reading.at / reading.done * (self.total - reading.done)
        return reading.eta_s, mean_rate, self.end - reading.at


def error(estimate: float, truth: float) -> float:
    return abs(estimate - truth) / truth


def errors_from_5_percent(run: PlayedRun) -> list[float]:
    """Every reading's error from 5% of the trials, until the last 10 s."""
    return [error(r.eta_s, run.end - r.at) for r in run.readings
            if r.done >= 0.05 * run.total and run.end - r.at > 10]


def whole_model() -> list[Problem]:
    """Like a whole-model run's: kernels of different sizes of space, each at 8 buckets; the
    small buckets searched exhaustively (all their candidates in the warm start), the others
    by TPE beyond a warm start of 5."""
    small, large = (7, 7), (16, 5)
    return [Problem(f"kernel{k}", candidates, (small,) * 3 + (large,) * 5)
            for k, candidates in enumerate((18, 60, 30, 30, 54, 54))]


def test_the_eta_is_within_30_percent_from_5_percent_of_the_trials_and_converges():
    # The tuner's time 1.5x the prior's, and one kernel's trials longer than predicted.
    truth = Truth(compile_s=3.0, pool_start_s=12.0, overhead_s=0.045, proposal_s=0.135,
                  bucket_s=0.375, busy_s={"kernel1": 0.3})
    run = PlayedRun(whole_model(), truth).play()
    errors = {share: error(eta, true) for share in (0.05, 0.25, 0.5, 0.75)
              for eta, _, true in [run.at_share(share)]}
    assert all(e < 0.3 for e in errors.values()), errors
    assert errors[0.75] < 0.1, errors
    # The old ETA charges the pool's start-up and the first compiles to every trial left.
    _, mean_rate, true = run.at_share(0.05)
    assert error(mean_rate, true) > 0.5
    assert run.readings[-1].eta_s < 0.1 * (run.end - run.readings[0].at)


def test_a_kernel_with_a_heavy_host_part_does_not_price_the_kernels_after_it():
    """As on the H200 (a Kimi-K2 config): the tuner's time per trial outside the GPU is the
    run's own (Optuna, the store) plus the kernel's host work, which for moe_dispatch was about
    0.28 s a trial, three to five times the kernels that ran after it. The trials left of a
    kernel not started yet are priced at the lightest measured, not at the run's average."""
    truth = Truth(compile_s=3.0, pool_start_s=12.0, overhead_s=0.06,
                  overhead_by_kernel_s={"kernel0": 0.12, "kernel1": 0.15, "kernel2": 0.28,
                                        "kernel3": 0.10})
    problems = [Problem(f"kernel{k}", candidates, ((16, 5),) * 6)
                for k, candidates in enumerate((18, 30, 30, 60, 54))]
    run = PlayedRun(problems, truth).play()
    errors = {share: error(eta, true) for share in (0.05, 0.25, 0.5, 0.75)
              for eta, _, true in [run.at_share(share)]}
    assert all(e < 0.3 for e in errors.values()), errors
    assert errors[0.5] < 0.15, errors


def test_the_first_eta_comes_from_the_prior_before_any_trial():
    run = PlayedRun(whole_model(), Truth(compile_s=2.0, pool_start_s=8.0))
    before = run.eta.remaining_s()
    run.play()
    assert error(before, run.end) < 0.3, (before, run.end)


def test_trials_that_waited_on_compiles_are_not_estimated_like_long_timings():
    """Two runs whose first bucket takes as long, one waiting for compiles (every point is
    compiled by the second bucket), the other timing slow points (as every bucket will)."""
    buckets = ((16, 16),) * 10
    compiles = PlayedRun([Problem("norm", 16, buckets)],
                         Truth(compile_s=3.0, pool_start_s=0.0, busy_s={"norm": 0.02},
                               overhead_s=0.05), processes=2).play()
    timings = PlayedRun([Problem("norm", 16, buckets)],
                        Truth(compile_s=0.05, pool_start_s=0.0, busy_s={"norm": 1.5},
                              overhead_s=0.05), processes=2).play()
    share = 0.1  # the first bucket done
    eta_c, mean_c, true_c = compiles.at_share(share)
    eta_t, mean_t, true_t = timings.at_share(share)
    assert mean_c == pytest.approx(mean_t, rel=0.15)  # the old ETA cannot tell them apart
    assert true_t > 5 * true_c
    assert error(eta_c, true_c) < 0.3 and error(eta_t, true_t) < 0.3, (eta_c, true_c,
                                                                         eta_t, true_t)


def test_compiles_stored_by_an_earlier_run_cost_nothing():
    problems = [Problem("norm", 30, ((16, 5),) * 4)]
    truth = Truth(compile_s=5.0, pool_start_s=10.0, overhead_s=0.1)
    cold = PlayedRun(problems, truth, processes=2)
    warm = PlayedRun(problems, truth, processes=2, stored=frozenset(range(30)))
    assert warm.eta.remaining_s() < 0.5 * cold.eta.remaining_s()
    for run in (cold.play(), warm.play()):
        eta, mean_rate, true = run.at_share(0)  # after the first trial
        assert error(eta, true) < 0.3, (eta, true)
    # The old ETA charges the cold run's first wait (start-up and a compile) to every trial.
    assert error(cold.at_share(0)[1], cold.at_share(0)[2]) > 1


def test_the_run_ends_once_the_pool_has_compiled_its_queue():
    """Few trials, many candidates queued ahead: the pool's queue outlasts the GPU's work."""
    run = PlayedRun([Problem("wide", 200, ((16, 5),) * 6)],
                    Truth(compile_s=3.0, pool_start_s=5.0), processes=2).play()
    assert run.end > 1.2 * run.readings[-1].at
    for share in (0.25, 0.5, 0.75):
        eta, _, true = run.at_share(share)
        assert error(eta, true) < 0.1, (share, eta, true)
    _, mean_rate, true = run.at_share(0.75)  # the trials left are not what is left
    assert error(mean_rate, true) > 0.3


def test_a_processs_first_compile_is_not_taken_for_every_compile():
    """Each compile process imports CuTeDSL at its first compile, which takes five times a
    compile; the pool's queue sets the run's end."""
    run = PlayedRun([Problem("wide", 160, ((16, 5),) * 8)],
                    Truth(compile_s=1.0, first_compile_s=5.0, pool_start_s=2.0,
                          busy_s={"wide": 0.02}, overhead_s=0.05), processes=8).play()
    for share in (0.05, 0.25, 0.5):  # at 5%, eight of the compiles done were first ones
        eta, mean_rate, true = run.at_share(share)
        assert error(eta, true) < 0.15, (share, eta, true)
    assert error(run.at_share(0.05)[1], run.at_share(0.05)[2]) > 1  # the mean-rate ETA


def test_the_eta_of_a_finished_run_is_zero():
    run = PlayedRun([Problem("norm", 30, ((16, 5),) * 4)], Truth()).play()
    assert run.readings[0].eta_s > 10 and run.eta.remaining_s() == 0.0


def test_two_gpu_workers_halve_the_gpu_part():
    problems = [Problem("norm", 16, ((16, 16),) * 12)]
    truth = Truth(compile_s=0.1, pool_start_s=0.0, busy_s={"norm": 0.5})
    one, two = PlayedRun(problems, truth, gpus=1), PlayedRun(problems, truth, gpus=2)
    assert two.eta.remaining_s() < 0.7 * one.eta.remaining_s()  # before any bucket
    one.play(), two.play()
    assert two.end < 0.6 * one.end
    eta, _, true = two.at_share(0.25)
    assert error(eta, true) < 0.2


def test_the_prior_prices_each_bucket_by_the_measurement_protocol():
    problem = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    decode, prefill = (plan_bucket(qk.KERNEL, problem, tokens, SPEC, CEILINGS)
                       for tokens in (1, 32768))
    small, large = bucket_work(decode, 16), bucket_work(prefill, 16)
    assert small.key == ("qk_norm", problem.with_tokens(1), 1) and small.trials == 16
    # A decode-sized point is timed four times (drift-corrected), a large one once, each graph
    # sized to about TARGET_GRAPH_US: a trial costs about the same either way.
    assert 0.5 < small.trial_busy_s / large.trial_busy_s < 2
    # A point slower than a graph's target time is timed in longer graphs.
    assert timing_s(20000.0, 1) > 5 * timing_s(200.0, 1)
    assert trial_busy_s(20000.0, 1, 10**9, 4000.0) > 5 * trial_busy_s(1.0, 64, 10**5, 4000.0)


def test_the_estimate_is_played_forward_at_most_once_a_refresh(monkeypatch):
    run = PlayedRun([Problem("norm", 8, ((8, 8),) * 2)], Truth())
    eta = RunEta(run.work, run.queue, 1, 12, lambda: (0.0, 0.0), clock=run.clock,
                 refresh_s=1.0)
    calls = []
    played = eta._played_forward
    monkeypatch.setattr(eta, "_played_forward", lambda now: calls.append(now) or played(now))
    first = eta.remaining_s()
    run.clock.now = 0.4
    assert eta.remaining_s() == pytest.approx(first - 0.4)
    run.clock.now = 1.0
    eta.remaining_s()
    assert calls == [0.0, 1.0]


class Watching:
    """An observer noting what the run tells it of its ETA."""

    def __init__(self):
        self.eta = None
        self.readings: list[float] = []

    def started(self, fingerprint, ceilings, pending, skipped, eta) -> None:
        self.pending, self.skipped, self.eta = pending, skipped, eta
        self.first = eta.remaining_s()

    def bucket_started(self, planned, expected_trials) -> None:
        pass

    def trial(self, planned, outcome, best) -> None:
        self.readings.append(self.eta.remaining_s())

    def bucket_finished(self, summary) -> None:
        pass


def test_a_run_keeps_its_observers_eta_current_and_counts_only_pending_buckets(tmp_path):
    """The fault kernel's sound points, the fake GPU worker, a real compile pool: a bucket stored
    by a first run is not in the second run's ETA, whose events reach it before the observer."""
    url, cache = f"sqlite:///{tmp_path / 'eta.db'}", tmp_path / "cache"
    db = Database.open(url)
    sound_points_only(db)
    storage = open_storage(url, 1, 2)
    tune_model(UNITS, [1], db, fault_workers(cache), RunOptions(3), Watching(), storage)
    seen = Watching()
    tune_model(UNITS, [1, 2], db, fault_workers(cache), RunOptions(3), seen, storage)
    db.dispose()
    assert seen.skipped == 1 and [b.planned.bucket for b in seen.pending] == [2]
    assert seen.eta.buckets == (("fault_injection", FaultProblem(num_tokens=1), 2),)
    assert seen.first > 0 and len(seen.readings) == 3
    assert seen.readings[-1] < seen.first and seen.eta.remaining_s() == 0.0


def test_a_buckets_first_trial_does_not_price_every_trial_after_it():
    """As on an H100 (a Kimi-K2 config): a bucket's first trial also makes its input sets and
    times the reference, up to a second of the GPU worker where its other trials take 0.05 s.
    Learnt into the kernel's rate per trial, it priced every trial after it as long: +31% at
    5% of the trials, read just after a new kernel's first trial."""
    run = PlayedRun(whole_model(), Truth(compile_s=0.5, pool_start_s=8.0,
                                         first_trial_s=1.0)).play()
    errors = errors_from_5_percent(run)
    assert max(errors) < 0.3, max(errors)


def test_a_light_kernel_of_few_trials_does_not_price_the_kernels_after_it():
    """A kernel searched exhaustively in few trials (none proposed) and light on the host,
    between kernels whose tuner time is 1.5x the prior's: priced at the smallest rate measured,
    the kernels after it read 24% short; at the geometric mean of the rates and the prior's,
    at most 16%."""
    truth = Truth(compile_s=0.5, pool_start_s=8.0, overhead_s=0.045, proposal_s=0.135,
                  overhead_by_kernel_s={"kernel1": 0.01})
    problems = [Problem("kernel0", 30, ((16, 5),) * 3), Problem("kernel1", 4, ((4, 4),) * 6),
                *(Problem(f"kernel{k}", 54, ((16, 5),) * 6) for k in (2, 3, 4))]
    run = PlayedRun(problems, truth).play()
    errors = errors_from_5_percent(run)
    assert max(errors) < 0.2, max(errors)
