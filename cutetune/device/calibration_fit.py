"""Fitting the calibrated cost model (calibrated.py) to one device's verified trials: its terms'
constants here, then the knob factors over what they leave (knob_fit.py).

The model is linear in its four time constants once the bytes in flight an SM needs is fixed,
so that one is searched over a grid of powers of two and, at each, the four are the
non-negative least-squares fit of relative error (each trial weighs by 1 / its measured time,
so a 2 us decode point counts as much as a 200 us prefill one). Four constants make fifteen
subsets of them free, each solved exactly: non-negative least squares without scipy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cutetune.device.calibrated import CalibratedModel, features
from cutetune.device.knob_fit import (
    PRUNE_FACTOR_FLOOR,
    PRUNE_QUANTILE,
    KnobSample,
    fit_knob_effects,
    needed_band,
)
from cutetune.device.roofline import predict
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.cost import Cost

# Fewer verified trials than this cannot pin four constants and the spread the pruning needs.
MIN_TRIALS = 40
IN_FLIGHT_GRID = tuple(2**k for k in range(11, 19))  # 2 KiB to 256 KiB per SM


class TunedBucket(NamedTuple):
    kernel: str
    problem: str  # its static key
    tokens: int


@dataclass(frozen=True)
class Sample:
    """One verified trial: what its point declares, the time measured, the bucket it was
    measured in, within which its spread is judged, and its knobs ("name=value", what the knob
    factors are fitted to; none: the trial fits the terms alone)."""

    cost: Cost
    measured_us: float
    bucket: TunedBucket
    knobs: tuple[str, ...] = ()


class TooFewTrials(ValueError):
    def __init__(self, have: int, need: int, gpu_name: str) -> None:
        super().__init__(f"{gpu_name}: {have} verified trials stored, calibration needs at "
                         f"least {need}; nothing stored")
        self.have = have
        self.need = need


def fit(samples: Sequence[Sample], spec: DeviceSpec, gpu_name: str,
        min_trials: int = MIN_TRIALS) -> CalibratedModel:
    """The calibrated model of `samples` (verified trials of one device); TooFewTrials where
    there are fewer than `min_trials`."""
    if len(samples) < min_trials:
        raise TooFewTrials(len(samples), min_trials, gpu_name)
    measured = np.array([s.measured_us for s in samples])
    best = None
    for in_flight in IN_FLIGHT_GRID:
        rows = np.array([features(s.cost, spec, in_flight).row() for s in samples])
        constants, residual = nonnegative_least_squares(rows / measured[:, None],
                                                        np.ones(len(samples)))
        if best is None or residual < best[0]:
            best = (residual, in_flight, constants, rows @ constants)
    _, in_flight, constants, predicted = best
    knobs = fit_knob_effects([
        KnobSample(s.bucket.kernel, s.bucket.problem, s.bucket.tokens, s.knobs, float(p),
                   s.measured_us)
        for s, p in zip(samples, predicted, strict=True) if s.knobs and p > 0])
    ceilings = Ceilings.from_datasheet(spec)
    datasheet = np.array([predict(s.cost, spec, ceilings).predicted_us for s in samples])
    ratio = predicted / measured
    launch, wave, barrier, us_per_mb = (float(c) for c in constants)
    return CalibratedModel(
        gpu_name=gpu_name, launch_us=launch, wave_us=wave, barrier_us=barrier,
        us_per_mb=us_per_mb, in_flight_bytes=float(in_flight),
        prune_factor=prune_factor(samples, predicted),
        trials=len(samples), median_error=float(np.median(np.abs(ratio - 1))),
        datasheet_error=float(np.median(np.abs(datasheet / measured - 1))),
        over_2x=float(np.mean((ratio > 2) | (ratio < 0.5))), knobs=knobs)


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """x >= 0 minimising |a x - b|^2, and that minimum: the best of the exact least-squares
    solutions over every subset of free columns whose solution is non-negative (the optimum
    is one of them: its zero entries fix the subset, and on the rest it is unconstrained)."""
    columns = a.shape[1]
    best_x, best_residual = np.zeros(columns), float(b @ b)
    for size in range(1, columns + 1):
        for free in itertools.combinations(range(columns), size):
            solution, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (solution < 0).any():
                continue
            x = np.zeros(columns)
            x[list(free)] = solution
            residual = float(np.sum((a @ x - b) ** 2))
            if residual < best_residual:
                best_x, best_residual = x, residual
    return best_x, best_residual


def prune_factor(samples: Sequence[Sample], predicted: np.ndarray) -> float:
    """The least factor over the best prediction of a bucket that still keeps a point measured
    within NEAR_BEST of the fastest there (knob_fit.needed_band), in PRUNE_QUANTILE of the
    buckets with more than one trial (never below PRUNE_FACTOR_FLOOR; infinite, pruning
    nothing, without such a bucket)."""
    by_bucket: dict[TunedBucket, list[tuple[float, float]]] = {}
    for sample, prediction in zip(samples, predicted, strict=True):
        by_bucket.setdefault(sample.bucket, []).append((sample.measured_us, float(prediction)))
    needed = [needed_band(points) for points in by_bucket.values() if len(points) > 1]
    if not needed:
        return math.inf
    return max(PRUNE_FACTOR_FLOOR, float(np.quantile(needed, PRUNE_QUANTILE)))
