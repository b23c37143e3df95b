"""The search: one Optuna study per (kernel, static problem, token bucket, device, kernel source).

The roofline's survivors are the candidates. The study is warm-started with the seed heuristic's
default, the incumbent and the lent points (finals.py) and the best-ranked points; it is
exhaustive when the candidates fit the trial budget and TPE otherwise. Each trial asks the
injected TrialRunner to compile, verify and time one point; a point that fails becomes a failed
trial with its reason and the search goes on. Finalists (the fastest few, the default, the
incumbent and the near-fastest the fixed order prefers) are re-measured in interleaved rounds,
and the winner is named by a tie band and a fixed order (finals.py), so that the same GPU names
the same winner.

A study in persistent storage survives its process. Each finished trial carries its outcome in
a user attribute, so a study started again continues where the last process stopped: finished
points are not timed again, the warm start is queued again from the first point not finished,
and trials a dead process left RUNNING are failed (study_storage.py). TPE is seeded
afresh before each ask from the number of asks already answered, so a resumed search proposes
what an uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from cutetune.build.interrupt import raise_if_interrupted
from cutetune.device.funnel import Plan, candidates_of
from cutetune.device.measure import Measurement
from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.tuner import finals
from cutetune.tuner.finals import TIE_BAND_FLOOR, Finals
from cutetune.tuner.study_storage import (
    claim,
    fail_abandoned_trials,
    heartbeat,
    requeue,
    warnings_silenced,
)

# TPE may propose points outside the candidates (invalid, pruned or quarantined); they cost no
# GPU time, but after this many asks in a row without a new point, the best-ranked point not
# yet tried is queued, so a search always reaches its budget.
ASKS_PER_TRIAL = 20
WARM_START_SHARE = 4  # a quarter of a TPE budget goes to the roofline's best-ranked points
# Failure reasons of points that took their process down: not tried again (quarantine).
PROCESS_FAILURES = ("hang", "crash", "cuda")
OUTCOME_ATTR = "cutetune_outcome"
ANSWERED_ATTR = "cutetune_answered"
FINALS_ATTR = "cutetune_finals"  # the study's: its finalists as re-measured, the band, winner


class TrialFailure(Exception):
    """A point that did not compile, launch or verify; `str()` is the stored reason."""


class TrialRunner(Protocol):
    def measure(self, config: Any) -> Measurement:
        """Compile, verify and time one point; raise TrialFailure if it cannot serve."""

    def remeasure(self, configs: Sequence[Any]) -> list[Measurement]:
        """Time already-measured points again in interleaved rounds, in the given order."""


@dataclass(frozen=True)
class TrialOutcome:
    number: int
    config: Any
    measurement: Measurement | None
    failure_reason: str | None
    predicted_us: float

    @property
    def ok(self) -> bool:
        return self.measurement is not None

    @property
    def took_process_down(self) -> bool:
        """A hang, a crash or a lost CUDA context: the point is quarantined."""
        return (self.failure_reason or "").startswith(PROCESS_FAILURES)


@dataclass(frozen=True)
class StudyResult:
    """`default` is the heuristic default's outcome, re-measured beside the winner when both
    verified; `tie_band` the relative gap within which finalists were tied (None without a
    winner); `resumed` counts the trials taken over from an earlier process."""

    problem: Problem
    study_name: str
    exhaustive: bool
    trials: tuple[TrialOutcome, ...]
    winner: TrialOutcome | None
    default: TrialOutcome | None
    resumed: int
    started_at: datetime
    finished_at: datetime
    tie_band: float | None = None


def ranked_candidates(plan: Plan, default: Any) -> list[Any]:
    """Every candidate in the order a study tries them unprompted: the default first, then the
    roofline's survivors best-ranked first."""
    return [default] + [p.config for p in plan.kept if p.config != default]


def candidate_order(plan: Plan, default: Any, budget: int,
                    warm_start_share: int = WARM_START_SHARE,
                    lent: Sequence[Any] = (), incumbent: Any = None) -> list[Any]:
    """The points to enqueue, in order: the default first, then the `incumbent` and the `lent`
    ones the roofline kept (finals.py), then the best-ranked ones (one `warm_start_share`-th of
    the budget; 1 gives the whole budget to them, no TPE); all of them when the candidates fit
    the budget."""
    ranked = ranked_candidates(plan, default)
    if len(ranked) <= budget:
        return ranked
    kept = {p.config for p in plan.kept}
    head = [c for c in (incumbent, *lent) if c in kept] + [
        p.config for p in plan.kept[: max(1, budget // warm_start_share)]]
    return list(dict.fromkeys([default] + head))[:budget]


def run_study(kernel: KernelDef, plan: Plan, default: Any, runner: TrialRunner, budget: int,
              study_name: str, storage: BaseStorage | str | None = None, seed: int = 0,
              on_trial: Callable[[TrialOutcome], None] | None = None,
              excluded: Collection[Any] = (), retry_failed: bool = False,
              tie_band: float = TIE_BAND_FLOOR,
              warm_start_share: int = WARM_START_SHARE, lent: Sequence[Any] = (),
              incumbent: Any = None) -> StudyResult:
    """Search `plan`'s candidates (less `excluded`) within `budget` trials, continuing the
    study of that name where one is stored. `retry_failed` tries again the points of a stored
    study that took their process down; `tie_band` is the least band within which finalists
    are tied (finals.py); `warm_start_share`, `lent` (the winners other problems of the kernel
    lend at this bucket) and `incumbent` (the problem's shipped winner at this bucket) as in
    candidate_order; the finals prefer the incumbent, then the lent points."""
    if budget < 1:
        raise ValueError(f"the trial budget must be at least 1, got {budget}")
    if warm_start_share < 1:
        raise ValueError(f"the warm start's share must be at least 1, got {warm_start_share}")
    if not 0 <= tie_band < 1:
        raise ValueError(f"the tie band must be a fraction from 0 to below 1, got {tie_band}")
    started = datetime.now(UTC)
    predicted = {p.config: p.prediction.predicted_us for p in plan.kept + plan.pruned}
    candidates = candidates_of(plan, default, excluded)
    ranked = [c for c in ranked_candidates(plan, default) if c in candidates]
    warm_start = [c for c in candidate_order(plan, default, budget, warm_start_share, lent,
                                             incumbent) if c in candidates]
    exhaustive = len(warm_start) == len(candidates)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                                load_if_exists=True)
    fail_abandoned_trials(study)
    outcomes = _stored_outcomes(study, kernel)
    if retry_failed:
        outcomes = {c: o for c, o in outcomes.items() if not o.took_process_down}
    resumed = len(outcomes)
    requeue(study, kernel.space, [c for c in warm_start if c not in outcomes])
    answered = sum(1 for t in study.get_trials(deepcopy=False)
                   if t.state.is_finished() and ANSWERED_ATTR in t.user_attrs)

    numbers = iter(range(max((o.number for o in outcomes.values()), default=-1) + 1, 2**31))
    asks_without_news = 0
    while len(outcomes) < min(budget, len(candidates)):
        raise_if_interrupted()
        if asks_without_news >= ASKS_PER_TRIAL:
            requeue(study, kernel.space, [next(c for c in ranked if c not in outcomes)],
                    keep_waiting=True)
            asks_without_news = 0
        study.sampler = optuna.samplers.TPESampler(seed=seed + answered)
        with warnings_silenced():
            trial = study.ask()
        claim(study, trial)  # at once: its owner and heartbeat tell a dead trial from a live one
        answered += 1
        config = kernel.space.sample(trial.suggest_categorical)
        if config not in candidates:
            _tell(study, trial, state=TrialState.PRUNED)
            asks_without_news += 1
            continue
        if config in outcomes:  # TPE repeats itself; the point is not timed twice
            seen = outcomes[config]
            _tell(study, trial, seen.measurement.median_us if seen.ok else None,
                  state=None if seen.ok else TrialState.FAIL)
            asks_without_news += 1
            continue
        asks_without_news = 0
        try:
            with heartbeat(study, trial):
                measurement, reason = runner.measure(config), None
        except TrialFailure as failure:
            measurement, reason = None, str(failure)
        except BaseException:  # Ctrl-C, or a bug: the trial is not left RUNNING
            study.tell(trial, state=TrialState.FAIL)
            raise
        outcome = TrialOutcome(next(numbers), config, measurement, reason, predicted[config])
        outcomes[config] = outcome
        trial.set_user_attr(OUTCOME_ATTR, _outcome_attr(outcome))
        _tell(study, trial, measurement.median_us if outcome.ok else None,
              state=None if outcome.ok else TrialState.FAIL)
        if on_trial is not None:
            on_trial(outcome)

    trials = tuple(sorted(outcomes.values(), key=lambda t: t.number))
    picked = _pick_winner(trials, runner, default, tie_band, frozenset(lent), incumbent)
    if picked is None:
        return StudyResult(plan.problem, study_name, exhaustive, trials, None,
                           outcomes.get(default), resumed, started, datetime.now(UTC))
    study.set_user_attr(FINALS_ATTR, picked.attr())
    return StudyResult(plan.problem, study_name, exhaustive, trials, picked.winner,
                       picked.default or outcomes.get(default), resumed, started,
                       datetime.now(UTC), picked.tie_band)


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None = None,
          state: TrialState | None = None) -> None:
    trial.set_user_attr(ANSWERED_ATTR, True)
    study.tell(trial, value, state=state)


def _outcome_attr(outcome: TrialOutcome) -> dict[str, Any]:
    m = outcome.measurement
    return {"number": outcome.number, "failure": outcome.failure_reason,
            "predicted_us": outcome.predicted_us,
            "median_us": m.median_us if m else None, "iqr_us": m.iqr_us if m else None,
            "repeats": m.repeats if m else None}


def _stored_outcomes(study: optuna.Study, kernel: KernelDef) -> dict[Any, TrialOutcome]:
    """The outcomes finished trials of the study carry, by config, in trial order."""
    outcomes = {}
    for trial in study.get_trials(deepcopy=False):
        attr = trial.user_attrs.get(OUTCOME_ATTR)
        if attr is None or not trial.state.is_finished():
            continue
        config = kernel.space.config_from_sampled(trial.params)
        measurement = (Measurement(attr["median_us"], attr["iqr_us"], attr["repeats"])
                       if attr["median_us"] is not None else None)
        outcomes[config] = TrialOutcome(attr["number"], config, measurement, attr["failure"],
                                        attr["predicted_us"])
    return outcomes


def _pick_winner(trials: Sequence[TrialOutcome], runner: TrialRunner, default: Any,
                 tie_band: float, lent: frozenset = frozenset(),
                 incumbent: Any = None) -> Finals | None:
    """The finalists re-measured side by side, and the winner among them (finals.py); None
    where no point verified. The default and the incumbent are always among them: timed in the
    same rounds, a tuned point cannot win or lose against them by the drift between two moments
    of a search."""
    chosen = finals.finalists([t for t in trials if t.ok], default, tie_band, lent, incumbent)
    if not chosen:
        return None
    if len(chosen) == 1:
        (only,) = chosen
        return Finals(tuple(chosen), finals.tie_band(only.measurement, tie_band), only, None,
                      incumbent)
    measured = runner.remeasure([t.config for t in chosen])
    return finals.pick(finals.remeasured(chosen, measured), default, tie_band, lent, incumbent)
