"""Fitting the knob factors (knob_effects.py) to one device's verified trials, after the terms
(calibration_fit.py).

The factors are the ridge least-squares fit of log(measured / predicted), centred per problem
and bucket so that only how the points of one bucket rank is fitted, never its absolute level
(the terms own that). How far to trust them is measured, not assumed: each of a kernel's
problems is left out of the fit in turn and its buckets predicted by the rest, as a problem
never tuned is; the kernel prunes beyond the factor over the best prediction that then kept a
point measured within NEAR_BEST of the fastest, in PRUNE_QUANTILE of those buckets. A kernel
tuned for one problem only cannot be checked so, and keeps no factors: the terms alone rank its
points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cutetune.device.knob_effects import KnobEffects

# Shrinks each factor towards 1 by this weight against its bucket's squared log residuals: a
# knob value seen in few points keeps a modest factor.
RIDGE = 1.0
# Both pruning models keep, in this share of the fitted buckets, a point measured within
# NEAR_BEST of the fastest there; and never prune within PRUNE_FACTOR_FLOOR of the best
# prediction. A search that finds a point within 1% of the best has found it: finalists that
# close are ties to the tuner (finals.py), and 1% is the regret issue 42 allows the pruning.
PRUNE_QUANTILE = 0.95
PRUNE_FACTOR_FLOOR = 1.1
NEAR_BEST = 0.01


@dataclass(frozen=True)
class KnobSample:
    """One verified trial as the knob fit reads it: where it was measured, its time and the
    terms' prediction of it."""

    kernel: str
    problem: str
    bucket: int
    knobs: tuple[str, ...]  # "name=value" of each knob of its config
    predicted_us: float
    measured_us: float

    @property
    def log_residual(self) -> float:
        return math.log(self.measured_us / self.predicted_us)


def fit_bucket(samples: Sequence[KnobSample]) -> dict[str, float]:
    """The log factor of each knob value among `samples` (one kernel, one bucket, any number
    of problems): ridge least squares of the residuals, each problem's centred on its mean."""
    names = sorted({knob for s in samples for knob in s.knobs})
    column = {name: i for i, name in enumerate(names)}
    by_problem: dict[str, list[KnobSample]] = defaultdict(list)
    for s in samples:
        by_problem[s.problem].append(s)
    rows, residuals = [], []
    for group in by_problem.values():
        x = np.zeros((len(group), len(names)))
        for i, s in enumerate(group):
            x[i, [column[k] for k in s.knobs]] = 1.0
        y = np.array([s.log_residual for s in group])
        rows.append(x - x.mean(axis=0))
        residuals.append(y - y.mean())
    x, y = np.vstack(rows), np.concatenate(residuals)
    beta = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(names)), x.T @ y)
    return {name: float(beta[i]) for name, i in column.items()}


def by_bucket(samples: Iterable[KnobSample]) -> dict[int, list[KnobSample]]:
    grouped: dict[int, list[KnobSample]] = defaultdict(list)
    for s in samples:
        grouped[s.bucket].append(s)
    return dict(sorted(grouped.items()))


def fit_kernel(samples: Sequence[KnobSample]) -> dict[int, dict[str, float]]:
    return {bucket: fit_bucket(group) for bucket, group in by_bucket(samples).items()}


def needed_factor(samples: Sequence[KnobSample], log_factors: Mapping[str, float]) -> float:
    """Over one tuned bucket's points, the least factor over the best corrected prediction
    that keeps a point measured within NEAR_BEST of the fastest."""
    return needed_band([(s.measured_us,
                         s.predicted_us * math.exp(sum(log_factors.get(k, 0.0) for k in s.knobs)))
                        for s in samples])


def needed_band(points: Sequence[tuple[float, float]]) -> float:
    """Of one bucket's (measured, predicted) points, the least factor over the best prediction
    that keeps a point measured within NEAR_BEST of the fastest."""
    fastest = min(measured for measured, _ in points)
    return (min(predicted for measured, predicted in points
                if measured <= fastest * (1 + NEAR_BEST))
            / min(predicted for _, predicted in points))


def fit_knob_effects(samples: Sequence[KnobSample]) -> KnobEffects:
    """The knob factors of every kernel of `samples` tuned for at least two problems, each with
    the prune factor its leave-one-problem-out predictions needed (module docstring)."""
    by_kernel: dict[str, list[KnobSample]] = defaultdict(list)
    for s in samples:
        by_kernel[s.kernel].append(s)
    log_factors, prune_factors = {}, {}
    for kernel, own in sorted(by_kernel.items()):
        needed = []
        for left_out in sorted({s.problem for s in own}):
            fitted = fit_kernel([s for s in own if s.problem != left_out])
            needed += [needed_factor(group, fitted.get(bucket, {})) for bucket, group
                       in by_bucket(s for s in own if s.problem == left_out).items()
                       if len(group) > 1 and fitted]
        if not needed:  # one problem only, or no bucket of more than one point
            continue
        log_factors[kernel] = fit_kernel(own)
        prune_factors[kernel] = max(PRUNE_FACTOR_FLOOR,
                                    float(np.quantile(needed, PRUNE_QUANTILE)))
    return KnobEffects(log_factors, prune_factors)
