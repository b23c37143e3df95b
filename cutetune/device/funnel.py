"""The funnel from declared points to the ones worth measuring, ranked by the roofline."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from cutetune.device.roofline import Prediction, predict
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.cost import Cost
from cutetune.kernels.registry import KernelDef
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
    config: Any
    cost: Cost
    prediction: Prediction


@dataclass(frozen=True)
class Plan:
    problem: Problem
    declared: int
    rejected_by: dict[str, int]
    kept: tuple[RankedPoint, ...]
    pruned: tuple[RankedPoint, ...]

    @property
    def valid(self) -> int:
        return len(self.kept) + len(self.pruned)

    def funnel(self) -> str:
        rejected = ", ".join(f"{n}: -{c}" for n, c in self.rejected_by.items()) or "none"
        return (f"declared {self.declared} -> valid {self.valid} (rejected {rejected}) -> "
                f"kept {len(self.kept)} (pruned {len(self.pruned)} predicted over "
                f"{PRUNE_FACTOR:g}x and {PRUNE_MARGIN_US:g} us beyond the best)")


def make_plan(kernel: KernelDef, problem: Problem, spec: DeviceSpec,
              ceilings: Ceilings) -> Plan:
    enumeration = kernel.space.enumerate(problem, spec)
    enumeration.raise_if_empty(f"{kernel.name} {problem.describe()}")
    ranked = sorted(
        (RankedPoint(c, cost, predict(cost, spec, ceilings))
         for c in enumeration.valid
         for cost in [kernel.cost(problem, c, spec)]),
        key=lambda p: p.prediction.predicted_us,
    )
    best = ranked[0].prediction.predicted_us
    limit = max(best * PRUNE_FACTOR, best + PRUNE_MARGIN_US)
    kept = tuple(p for p in ranked if p.prediction.predicted_us <= limit)
    pruned = tuple(p for p in ranked if p.prediction.predicted_us > limit)
    return Plan(problem, enumeration.declared, enumeration.rejections_by_constraint(),
                kept, pruned)


def candidates_of(plan: Plan, default: Any, excluded: Collection[Any] = ()) -> set[Any]:
    """The points a study of `plan` may time: the roofline's survivors and the default, less
    `excluded` (quarantined points)."""
    return ({p.config for p in plan.kept} | {default}) - set(excluded)
