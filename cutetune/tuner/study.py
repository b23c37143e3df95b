"""The search: one Optuna study per (kernel, static problem, token bucket, device).

The roofline's survivors are the candidates. The study is warm-started with the seed heuristic's
default and the best-ranked points; it is exhaustive when the candidates fit the trial budget
and TPE otherwise. Each trial asks the injected TrialRunner to compile, verify and time one
point; a point that fails becomes a failed trial with its reason and the search goes on.
Finalists (the fastest few and the default) are re-measured in interleaved rounds before a
winner is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import optuna

from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.tuner.measure import Measurement
from cutetune.tuner.plan import Plan

FINALISTS = 3
# TPE may propose points outside the candidates (invalid or pruned); they cost no GPU time,
# but a study that proposes only those must still end.
ASKS_PER_TRIAL = 20
WARM_START_SHARE = 4  # a quarter of a TPE budget goes to the roofline's best-ranked points


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


@dataclass(frozen=True)
class StudyResult:
    problem: Problem
    study_name: str
    exhaustive: bool
    trials: tuple[TrialOutcome, ...]
    winner: TrialOutcome | None
    started_at: datetime
    finished_at: datetime


def _distributions(kernel: KernelDef) -> dict[str, optuna.distributions.CategoricalDistribution]:
    return {p.name: optuna.distributions.CategoricalDistribution(p.choices)
            for p in kernel.space.params}


def candidate_order(plan: Plan, default: Any, budget: int) -> list[Any]:
    """The points to enqueue, in order: the default first, then the best-ranked ones; all of
    them when the candidates fit the budget."""
    ranked = [p.config for p in plan.kept]
    exhaustive = len(ranked) + (default not in ranked) <= budget
    head = ranked if exhaustive else ranked[: max(1, budget // WARM_START_SHARE)]
    return [default] + [c for c in head if c != default]


def run_study(kernel: KernelDef, plan: Plan, default: Any, runner: TrialRunner, budget: int,
              study_name: str, storage: optuna.storages.BaseStorage | str | None = None,
              seed: int = 0,
              on_trial: Callable[[TrialOutcome], None] | None = None) -> StudyResult:
    if budget < 1:
        raise ValueError(f"the trial budget must be at least 1, got {budget}")
    started = datetime.now(UTC)
    predicted = {p.config: p.prediction.predicted_us for p in plan.kept + plan.pruned}
    candidates = {p.config for p in plan.kept} | {default}
    enqueued = candidate_order(plan, default, budget)
    exhaustive = len(enqueued) == len(candidates)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage is not None:
        try:  # one study per key: a new tuning run replaces the previous search
            optuna.delete_study(study_name=study_name, storage=storage)
        except KeyError:
            pass
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    for config in enqueued:
        study.enqueue_trial(dataclasses.asdict(config))

    distributions = _distributions(kernel)
    outcomes: dict[Any, TrialOutcome] = {}
    for _ in range(budget * ASKS_PER_TRIAL):
        if len(outcomes) >= min(budget, len(candidates)):
            break
        trial = study.ask(distributions)
        config = kernel.space.config_from_dict(trial.params)
        if config not in candidates:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        if config in outcomes:  # TPE repeats itself; the point is not timed twice
            seen = outcomes[config]
            study.tell(trial, seen.measurement.median_us if seen.ok else None,
                       state=None if seen.ok else optuna.trial.TrialState.FAIL)
            continue
        try:
            measurement, reason = runner.measure(config), None
        except TrialFailure as failure:
            measurement, reason = None, str(failure)
        outcome = TrialOutcome(len(outcomes), config, measurement, reason, predicted[config])
        outcomes[config] = outcome
        if outcome.ok:
            study.tell(trial, measurement.median_us)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if on_trial is not None:
            on_trial(outcome)

    trials = tuple(outcomes.values())
    winner = _pick_winner(trials, runner, default)
    return StudyResult(plan.problem, study_name, exhaustive, trials, winner, started,
                       datetime.now(UTC))


def _pick_winner(trials: Sequence[TrialOutcome], runner: TrialRunner,
                 default: Any) -> TrialOutcome | None:
    """The best of the fastest few, re-measured side by side. The default is always among
    them: timed in the same rounds, a tuned point cannot lose to it by the drift between two
    moments of a search."""
    ok = sorted((t for t in trials if t.ok), key=lambda t: t.measurement.median_us)
    if not ok:
        return None
    finalists = ok[:FINALISTS]
    finalists += [t for t in ok[FINALISTS:] if t.config == default]
    if len(finalists) == 1:
        return finalists[0]
    remeasured = runner.remeasure([t.config for t in finalists])
    best = min(range(len(finalists)), key=lambda i: remeasured[i].median_us)
    return dataclasses.replace(finalists[best], measurement=remeasured[best])
