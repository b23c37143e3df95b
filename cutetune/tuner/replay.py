"""Searches replayed from stored exhaustive measurements, without a GPU (kernel_tuner calls it
simulation): the tuner's own plan, pruning and Optuna study, with the trial runner replaced
by a lookup of each point's measured time. Comparing cost models, pruning bands and budgets
then costs CPU seconds over many buckets, not GPU hours.

Per bucket, against the exhaustive best (the fastest verified point of every valid one):
- pruning: the share of valid points the plan keeps (the points lent to it among them), and
  its regret (the best kept point, or the default the study always times, over the exhaustive
  best, less one);
- search: how many trials the study took before one came within SEARCH_BAND of the exhaustive
  best, as a share of the valid points (an exhaustive search's trials);
- zero-shot: the gap to the exhaustive best of what serving picks for an untuned problem (a
  winner borrowed from another problem at the bucket, where one lends a valid point, else the
  cost model's top pick), and of the cost model's own pick.

Fresh runs replayed (issue 38 item 1): the same search several times over the stored times as
fresh runs would read them (RunNoise), to count the buckets where every run names one winner.
A change to the search or the finals is then compared on the exhaustive measurements in CPU
time, not in ten fresh runs on the GPU per try.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import (
    Lender,
    borrowed_pick,
    lent_configs,
    make_plan,
    predicted_best,
)
from cutetune.device.knob_fit import NEAR_BEST
from cutetune.device.measure import Measurement
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.tuner.defaults import DEFAULT_BUDGET
from cutetune.tuner.finals import TIE_BAND_FLOOR
from cutetune.tuner.study import WARM_START_SHARE, TrialFailure, TrialOutcome, run_study

SEARCH_BAND = 0.02  # "within 2% of the exhaustive best"
ZERO_SHOT_BAND = 0.03  # "the top pick within 3% of the exhaustive winner"
REGRET_BAND = NEAR_BEST  # "regret at most 1%": what the pruning is cross-validated to keep
IQR_PER_SIGMA = 1.349  # a normal distribution's interquartile range, in sigmas


class ReplayRunner:
    """A TrialRunner that answers with stored times: `times` maps each config to its measured
    median, or to None where it failed; a config without a time was not measured."""

    def __init__(self, times: Mapping[Any, float | None]):
        self.times = times

    def _time(self, config: Any) -> float:
        if config not in self.times:
            raise TrialFailure("not measured: the stored measurements lack this point")
        if self.times[config] is None:
            raise TrialFailure("failed when measured")
        return self.times[config]

    def measure(self, config: Any) -> Measurement:
        return Measurement(self._time(config), 0.0, 1)

    def remeasure(self, configs: Sequence[Any]) -> list[Measurement]:
        return [self.measure(c) for c in configs]


@dataclass(frozen=True)
class RunNoise:
    """How a fresh run's times differ from the stored ones, as lognormal factors of these
    sigmas: `drift`, drawn once per run and point (where the run's input sets sit, the GPU's
    state that minute: what moves the ratio of the same two finalists between runs), and
    `jitter`, drawn per measurement (what one set of rounds sees)."""

    drift: float
    jitter: float


class FreshRunRunner(ReplayRunner):
    """The stored times as fresh run `run` reads them (RunNoise). A point's drift depends on the
    run and the point alone, so the run reads it alike in its search and its finals, and the
    replay of a run is the same whenever it is made."""

    def __init__(self, times: Mapping[Any, float | None], noise: RunNoise, run: int):
        super().__init__(times)
        self.noise = noise
        self.run = run
        self._jitter = random.Random(f"jitter {run}")

    def measure(self, config: Any) -> Measurement:
        drift = random.Random(f"drift {self.run} {config!r}").gauss(0.0, self.noise.drift)
        us = self._time(config) * math.exp(drift + self._jitter.gauss(0.0, self.noise.jitter))
        return Measurement(us, us * IQR_PER_SIGMA * self.noise.jitter, 1)


@dataclass(frozen=True)
class FreshRuns:
    """One bucket searched by replayed fresh runs: each run's winner, its stored time, and the
    bucket's exhaustive best (the fastest verified point's stored time)."""

    winners: tuple[Any, ...]
    winner_us: tuple[float, ...]
    best_us: float

    @property
    def one_winner(self) -> bool:
        return len(set(self.winners)) == 1

    @property
    def spread(self) -> float:
        """How much slower the slowest run's winner is than the fastest's, by stored times."""
        return max(self.winner_us) / min(self.winner_us) - 1

    @property
    def prices(self) -> tuple[float, ...]:
        """How much slower each run's winner is than the exhaustive best, by stored times."""
        return tuple(us / self.best_us - 1 for us in self.winner_us)


def fresh_runs(kernel: KernelDef, problem: Problem, times: Mapping[Any, float | None],
               spec: DeviceSpec, ceilings: Ceilings, calibrated: CalibratedModel | None,
               noise: RunNoise, runs: int, budget: int = DEFAULT_BUDGET,
               tie_band: float = TIE_BAND_FLOOR,
               warm_start_share: int = WARM_START_SHARE,
               lenders: Mapping[Lender, Any] | None = None,
               shipped_first: bool = False) -> FreshRuns:
    """The tuner's plan and search of `problem` replayed as `runs` fresh runs over `times`,
    each reading them through its own RunNoise draws (module docstring); `lenders` as in
    replay_bucket, which every run is lent alike. With `shipped_first`, one more run (with
    draws of its own) tunes the bucket before them, and its winner is their incumbent, as a
    problem's shipped winner is to fresh runs on a GPU of the model it was tuned on."""
    lent = lent_configs(kernel, problem, spec, lenders or {})
    default = kernel.default_config(problem, spec)

    def winner_of(run: int, incumbent: Any) -> Any:
        always_kept = lent if incumbent is None else (incumbent, *lent)
        plan = make_plan(kernel, problem, spec, ceilings, calibrated, always_kept)
        result = run_study(kernel, plan, default, FreshRunRunner(times, noise, run), budget,
                           f"fresh run {run} {kernel.name} {problem.static_key()} "
                           f"{problem.num_tokens}", tie_band=tie_band,
                           warm_start_share=warm_start_share, lent=lent, incumbent=incumbent)
        if result.winner is None:
            raise ValueError(f"no point of {kernel.name} {problem.describe()} verified")
        return result.winner.config

    incumbent = winner_of(runs, None) if shipped_first else None
    winners = [winner_of(run, incumbent) for run in range(runs)]
    best = min(us for us in times.values() if us is not None)
    return FreshRuns(tuple(winners), tuple(times[c] for c in winners), best)


@dataclass(frozen=True)
class BucketReplay:
    """One bucket replayed; times in microseconds. `trials_to_band` is None where the search
    never came within SEARCH_BAND of the best."""

    valid: int
    kept: int
    best_us: float
    best_kept_us: float
    trials: int
    trials_to_band: int | None
    top_pick_us: float | None  # serving's pick; None: it failed when measured
    model_pick_us: float | None  # the cost model's own pick; None: it failed when measured

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.valid

    @property
    def regret(self) -> float:
        return self.best_kept_us / self.best_us - 1

    @property
    def search_fraction(self) -> float:
        """Trials to within the band over the valid points; infinite where never."""
        return float("inf") if self.trials_to_band is None else self.trials_to_band / self.valid

    @property
    def zero_shot_gap(self) -> float:
        return float("inf") if self.top_pick_us is None else self.top_pick_us / self.best_us - 1

    @property
    def model_pick_gap(self) -> float:
        return (float("inf") if self.model_pick_us is None
                else self.model_pick_us / self.best_us - 1)


def trials_to_band(measured_in_order: Sequence[float | None], best_us: float,
                   band: float = SEARCH_BAND) -> int | None:
    """The number of trials, in the order taken, up to and including the first within `band`
    of `best_us` (None entries failed); None where none is."""
    for index, us in enumerate(measured_in_order, 1):
        if us is not None and us <= best_us * (1 + band):
            return index
    return None


def replay_bucket(kernel: KernelDef, problem: Problem, times: Mapping[Any, float | None],
                  spec: DeviceSpec, ceilings: Ceilings, calibrated: CalibratedModel | None,
                  budget: int = DEFAULT_BUDGET, seed: int = 0,
                  lenders: Mapping[Lender, Any] | None = None) -> BucketReplay:
    """The tuner's plan and search of `problem` (at its bucket's token count) replayed over
    `times`, the exhaustive measurements of its valid points; `lenders` are the winners at
    this bucket (lender -> config), which the plan keeps and the study tries first where they
    are valid points (funnel.lent_points), as the tuner's do, and serving may borrow."""
    lent = lent_configs(kernel, problem, spec, lenders or {})
    plan = make_plan(kernel, problem, spec, ceilings, calibrated, lent)
    valid = [p.config for p in plan.kept + plan.pruned]
    ok = {c: times[c] for c in valid if times.get(c) is not None}
    if not ok:
        raise ValueError(f"no valid point of {kernel.name} {problem.describe()} has a stored "
                         "time: measure the bucket exhaustively first")
    default = kernel.default_config(problem, spec)
    taken: list[TrialOutcome] = []
    run_study(kernel, plan, default, ReplayRunner(times), budget,
              f"replay {kernel.name} {problem.static_key()} {problem.num_tokens}",
              seed=seed, on_trial=taken.append, lent=lent)
    best = min(ok.values())
    kept = {p.config for p in plan.kept} | {default}
    if calibrated is not None:
        pick = predicted_best(kernel, problem, spec, calibrated, default)
    else:
        pick = plan.kept[0].config
    borrowed = borrowed_pick(kernel, problem, spec, lenders or {}, calibrated)
    return BucketReplay(
        valid=len(valid), kept=len(plan.kept), best_us=best,
        best_kept_us=min((ok[c] for c in kept if c in ok), default=float("inf")),
        trials=len(taken),
        trials_to_band=trials_to_band(
            [t.measurement.median_us if t.ok else None for t in taken], best),
        top_pick_us=ok.get(pick if borrowed is None else borrowed[1]),
        model_pick_us=ok.get(pick))


@dataclass(frozen=True)
class ReplaySummary:
    """Over buckets: the median kept share, the largest and median regret and the share of
    buckets within REGRET_BAND, the median search share (infinite where most never came within
    the band), and the shares of buckets whose serving pick (borrowed, else the model's) and
    whose cost model's own pick are within ZERO_SHOT_BAND."""

    buckets: int
    median_kept_fraction: float
    max_regret: float
    median_regret: float
    within_regret_band: float
    median_search_fraction: float
    zero_shot_within_band: float
    model_pick_within_band: float


def summarize(replays: Sequence[BucketReplay]) -> ReplaySummary:
    if not replays:
        raise ValueError("no bucket to summarize")
    regrets = [r.regret for r in replays]
    return ReplaySummary(
        buckets=len(replays),
        median_kept_fraction=statistics.median(r.kept_fraction for r in replays),
        max_regret=max(regrets), median_regret=statistics.median(regrets),
        within_regret_band=sum(g <= REGRET_BAND for g in regrets) / len(replays),
        median_search_fraction=statistics.median(r.search_fraction for r in replays),
        zero_shot_within_band=sum(r.zero_shot_gap <= ZERO_SHOT_BAND
                                  for r in replays) / len(replays),
        model_pick_within_band=sum(r.model_pick_gap <= ZERO_SHOT_BAND
                                   for r in replays) / len(replays))
