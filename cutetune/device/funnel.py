"""The funnel from declared points to the ones worth measuring, ranked by the cost model: the
device's calibrated model where one is fitted (calibrated.py), the datasheet roofline
otherwise."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from cutetune.device.calibrated import CalibratedModel, Terms, datasheet_terms
from cutetune.device.knob_effects import KnobPoint
from cutetune.device.roofline import Prediction, predict
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.cost import Cost
from cutetune.kernels.registry import KernelDef, get_kernel
from cutetune.kernels.stored import UnusablePoint, stored_point
from cutetune.spaces.problem import Problem

# A point predicted slower than this multiple of the best prediction is not measured: the
# model is coarse, so the margin is wide, but a 2x loss is one no calibration error explains.
PRUNE_FACTOR = 2.0
# ... and predicted at least this much slower in absolute terms. Decode-sized predictions are
# latency terms the model knows least (a decode-sized point can measure several times its
# prediction, as moe_combine's best point for deepseek-v3 at 8 tokens does), so there a 2x
# ratio alone would prune every alternative unmeasured.
PRUNE_MARGIN_US = 2.0


@dataclass(frozen=True)
class RankedPoint:
    """`prediction.predicted_us` is the ranking model's (the calibrated one where given) and
    `terms` its parts."""

    config: Any
    cost: Cost
    prediction: Prediction
    terms: Terms


@dataclass(frozen=True)
class Plan:
    kernel: str
    problem: Problem
    declared: int
    rejected_by: dict[str, int]
    kept: tuple[RankedPoint, ...]
    pruned: tuple[RankedPoint, ...]
    calibrated: CalibratedModel | None = None
    lent_beyond_band: int = 0  # kept points the band alone prunes: other problems' winners

    @property
    def valid(self) -> int:
        return len(self.kept) + len(self.pruned)

    def funnel(self) -> str:
        rejected = ", ".join(f"{n}: -{c}" for n, c in self.rejected_by.items()) or "none"
        if self.calibrated is None:
            pruned = (f"pruned {len(self.pruned)} by the datasheet roofline: predicted over "
                      f"{PRUNE_FACTOR:g}x and {PRUNE_MARGIN_US:g} us beyond the best")
        else:
            pruned = (f"pruned {len(self.pruned)} by the calibrated model: predicted over "
                      f"{self.calibrated.prune_factor_of(self.kernel):.2f}x the best")
        lent = (f"; {self.lent_beyond_band} beyond it kept as other problems' winners"
                if self.lent_beyond_band else "")
        return (f"declared {self.declared} -> valid {self.valid} (rejected {rejected}) -> "
                f"kept {len(self.kept)} ({pruned}{lent})")


def make_plan(kernel: KernelDef, problem: Problem, spec: DeviceSpec, ceilings: Ceilings,
              calibrated: CalibratedModel | None = None, lent: Collection[Any] = ()) -> Plan:
    """The valid points ranked by predicted time, split into those worth measuring and those
    pruned: by `calibrated` (the device's fitted model) where given, which prunes by the
    spread its fit measured, else by the datasheet roofline and its wide margins. The `lent`
    points (lent_points: winners of the kernel's other problems at this bucket) are kept
    whatever their prediction: a point that won a problem of the kernel is the likeliest
    winner of a near one, and where the band misses the best point, one of them is often
    within a percent of it ("Replayed searches" in BENCHMARKS.md)."""
    enumeration = kernel.space.enumerate(problem, spec)
    enumeration.raise_if_empty(f"{kernel.name} {problem.describe()}")
    ranked = sorted((ranked_point(c, kernel.cost(problem, c, spec), spec, ceilings, calibrated,
                                  (kernel.name, problem.num_tokens, c))
                     for c in enumeration.valid),
                    key=lambda p: p.prediction.predicted_us)
    best = ranked[0].prediction.predicted_us
    if calibrated is None:
        limit = max(best * PRUNE_FACTOR, best + PRUNE_MARGIN_US)
    else:
        limit = best * calibrated.prune_factor_of(kernel.name)
    lent = set(lent)
    kept = tuple(p for p in ranked if p.prediction.predicted_us <= limit or p.config in lent)
    pruned = tuple(p for p in ranked if p.prediction.predicted_us > limit and p.config not in lent)
    return Plan(kernel.name, problem, enumeration.declared, enumeration.rejections_by_constraint(),
                kept, pruned, calibrated, sum(p.prediction.predicted_us > limit for p in kept))


def ranked_point(config: Any, cost: Cost, spec: DeviceSpec, ceilings: Ceilings,
                 calibrated: CalibratedModel | None, point: KnobPoint) -> RankedPoint:
    prediction = predict(cost, spec, ceilings)
    if calibrated is None:
        return RankedPoint(config, cost, prediction, datasheet_terms(cost, prediction, ceilings))
    terms = calibrated.terms(cost, spec, point)
    return RankedPoint(config, cost, replace(prediction, predicted_us=terms.total_us), terms)


def predicted_best(kernel: KernelDef, problem: Problem, spec: DeviceSpec,
                   calibrated: CalibratedModel, default: Any) -> Any:
    """The valid point `calibrated` predicts fastest, where it predicts the heuristic's
    `default` slower than that by more than its pruning band; else `default`. Within the band
    the model cannot tell the two apart (its fit measured that spread within a bucket), and
    the heuristic knows what the model's terms do not (on the H200's stored trials of
    qwen3-8b and qwen3-30b-a3b, the model's plain pick was within 3% of the best measured in
    49% of buckets, the heuristic's in 56%, and this rule's in 56% with a smaller mean gap)."""
    enumeration = kernel.space.enumerate(problem, spec)
    enumeration.raise_if_empty(f"{kernel.name} {problem.describe()}")
    predicted = {c: calibrated.predict_us(kernel.cost(problem, c, spec), spec,
                                          (kernel.name, problem.num_tokens, c))
                 for c in enumeration.valid}
    best = min(predicted, key=predicted.get)
    # Rounding apart, a tie is within any band.
    band = predicted[best] * max(calibrated.prune_factor_of(kernel.name), 1.0) * (1 + 1e-9)
    return default if predicted.get(default, math.inf) <= band else best


class Lender(NamedTuple):
    """Whose winner a point lent at a bucket is: a kernel (the borrowing one, or one it
    `borrows_from`) and its problem's static key."""

    kernel: str
    problem: str

    def describe(self) -> str:
        return f"{self.kernel} {self.problem}"


def lenders_by_bucket(kernel: KernelDef, winners: Iterable[Any],
                      spec: DeviceSpec) -> dict[int, dict[Lender, Any]]:
    """The configs of `winners` (results_db Winner records) of `kernel` and of the kernels it
    `borrows_from`, each of its own current source, by bucket and lender, a later record over
    an earlier one of the same bucket and problem; a winner today's space rejects lends
    nothing (its own problem's plan reports it)."""
    lending = {kernel.name: kernel} | {name: get_kernel(name) for name in kernel.borrows_from}
    current = {name: k.source_hash() for name, k in lending.items()}
    by_bucket: dict[int, dict[Lender, Any]] = {}
    for w in winners:
        if current.get(w.kernel_name) != w.source_hash:
            continue
        try:
            point = stored_point(lending[w.kernel_name], w.static_key, w.bucket,
                                 w.config_json, spec)
        except UnusablePoint:
            continue
        by_bucket.setdefault(w.bucket, {})[Lender(w.kernel_name, w.static_key)] = point.config
    return by_bucket


def lent_points(kernel: KernelDef, problem: Problem, spec: DeviceSpec,
                lenders: Mapping[Lender, Any]) -> list[tuple[Lender, Any]]:
    """Of `lenders` (the winners at `problem`'s bucket, by lender), those of `kernel`'s other
    problems and of the kernels it `borrows_from` whose winner is a valid point of `problem`,
    as (lender, config): the kernel's own problems first, each group nearest `problem` in the
    bytes its default moves first (then by lender). Nearby problems of one kernel share their
    best points where the model's terms cannot tell the candidates apart (the replay measures
    it: "Replayed searches" in BENCHMARKS.md)."""
    own = Lender(kernel.name, problem.static_key())
    kin = (kernel.name, *kernel.borrows_from)
    valid = [(lender, config) for lender, config in lenders.items()
             if lender != own and lender.kernel in kin
             and kernel.space.first_violation(problem, config, spec) is None]

    def moved(lender: Lender) -> int:
        lending = kernel if lender.kernel == kernel.name else get_kernel(lender.kernel)
        p = lending.problem_type.from_static_key(lender.problem, problem.num_tokens)
        return lending.cost(p, lending.default_config(p, spec), spec).bytes_moved

    here = kernel.cost(problem, kernel.default_config(problem, spec), spec).bytes_moved \
        if valid else 0
    return sorted(valid, key=lambda lent: (lent[0].kernel != kernel.name,
                                           abs(math.log(moved(lent[0]) / here)), lent[0]))


def lent_configs(kernel: KernelDef, problem: Problem, spec: DeviceSpec,
                 lenders: Mapping[Lender, Any]) -> tuple[Any, ...]:
    """The configs of `lent_points`, in its order: what a plan keeps whatever the model
    predicts (make_plan) and a study tries first."""
    return tuple(config for _, config in lent_points(kernel, problem, spec, lenders))


def borrowed_pick(kernel: KernelDef, problem: Problem, spec: DeviceSpec,
                  lenders: Mapping[Lender, Any], calibrated: CalibratedModel | None = None
                  ) -> tuple[Lender, Any] | None:
    """Of `lent_points`, (lender, config): among the kernel's own problems' where any lends,
    else among the kernels' it borrows from, the one `calibrated` predicts fastest for
    `problem`, the nearest where there is no calibration (or two predictions tie); None where
    none lends. Each lent point is another problem's best; the model's knob factors are what
    can tell which suits this problem (how often it is within 3% of the best: "Replayed
    searches" in BENCHMARKS.md)."""
    lent = lent_points(kernel, problem, spec, lenders)
    if lent:
        lent = [p for p in lent if p[0].kernel == lent[0][0].kernel]
    if not lent or calibrated is None:
        return lent[0] if lent else None
    # min() keeps the first of equal predictions: the nearest.
    return min(lent, key=lambda lent_point: calibrated.predict_us(
        kernel.cost(problem, lent_point[1], spec), spec,
        (kernel.name, problem.num_tokens, lent_point[1])))


def candidates_of(plan: Plan, default: Any, excluded: Collection[Any] = ()) -> set[Any]:
    """The points a study of `plan` may time: the roofline's survivors and the default, less
    `excluded` (quarantined points)."""
    return ({p.config for p in plan.kept} | {default}) - set(excluded)
