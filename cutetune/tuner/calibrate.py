"""Calibrating the cost model from the results database: each stored device's verified trials,
read back as points of today's kernels, fitted (device/calibration_fit.py) and stored."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.calibration_fit import MIN_TRIALS, Sample, TooFewTrials, TunedBucket, fit
from cutetune.device.knob_effects import knob_names
from cutetune.device.specs import DeviceSpec, device_spec_for
from cutetune.kernels.stored import UnusablePoint, stored_point
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    record_calibration,
    stored_devices,
    trials_frame,
)


@dataclass(frozen=True)
class DeviceCalibration:
    """What calibrating one device came to: its model (stored), or why not (`refused`, one
    line, nothing stored)."""

    fingerprint: DeviceFingerprint
    model: CalibratedModel | None
    refused: str | None


def samples_of(rows: Iterable[dict], spec: DeviceSpec) -> list[Sample]:
    """The verified trials among `rows` (trials_frame records) as fit samples; a trial whose
    point today's kernels no longer accept (a knob since removed, say) is left out."""
    samples = []
    for row in rows:
        if row["status"] != "ok":
            continue
        try:
            point = stored_point(row["kernel_name"], row["static_key"], row["bucket"],
                                 row["config_json"], spec)
        except UnusablePoint:
            continue
        samples.append(Sample(point.kernel.cost(point.problem, point.config, spec),
                              row["median_us"],
                              TunedBucket(row["kernel_name"], row["static_key"], row["bucket"]),
                              knob_names(point.config)))
    return samples


def fit_devices(db: Database, min_trials: int = MIN_TRIALS) -> list[DeviceCalibration]:
    """The cost model of every device stored in `db` that has at least `min_trials` verified
    trials, fitted and not yet stored (reading only); the others refused with how many they
    have."""
    results = []
    for fingerprint in stored_devices(db):
        try:
            spec = device_spec_for(fingerprint.gpu_name)
        except ValueError as err:
            results.append(DeviceCalibration(fingerprint, None, str(err)))
            continue
        rows = trials_frame(db, fingerprint=fingerprint).to_dict("records")
        try:
            model = fit(samples_of(rows, spec), spec, fingerprint.gpu_name, min_trials)
        except TooFewTrials as err:
            results.append(DeviceCalibration(fingerprint, None, str(err)))
            continue
        results.append(DeviceCalibration(fingerprint, model, None))
    return results


def store_calibrations(db: Database, results: Iterable[DeviceCalibration]) -> None:
    """Store the fitted models among `results` (fit_devices') in `db`."""
    for result in results:
        if result.model is not None:
            record_calibration(db, result.fingerprint, result.model)


def calibrate(db: Database, min_trials: int = MIN_TRIALS) -> list[DeviceCalibration]:
    """Fit and store the cost model of every device stored in `db` (fit_devices)."""
    results = fit_devices(db, min_trials)
    store_calibrations(db, results)
    return results
