"""A calibrated cost model with known constants, and trials it times, for tests that must know
the answer: the fit recovers it, a replay scored against it loses nothing, serving picks its
best points."""

from __future__ import annotations

from datetime import UTC, datetime

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.cost import Cost
from cutetune.kernels.registry import get_kernel
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    TrialRecord,
    TuningResult,
    record_tuning_result,
)
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json

SPEC = DEVICE_SPECS["H200"]
KNOWN = CalibratedModel(gpu_name="NVIDIA H200", launch_us=1.1, wave_us=0.35, barrier_us=2.0,
                        us_per_mb=0.22, in_flight_bytes=8192.0, prune_factor=1.2, trials=0,
                        median_error=0.0, datasheet_error=0.0, over_2x=0.0)


def store_known_trials(db: Database, fingerprint: DeviceFingerprint, buckets: tuple[int, ...],
                       per_bucket: int | None = None, model: str = "qwen3-8b") -> list[Cost]:
    """Every valid point of `model`'s first rmsnorm problem at `buckets` (the first
    `per_bucket` of each), timed by KNOWN and stored as one run per bucket, with one failed
    trial each; the costs of the verified ones."""
    kernel = get_kernel("rmsnorm")
    static = kernel.problems_for_model(load_model(model), "bfloat16")[0]
    costs = []
    for bucket in buckets:
        problem = static.with_tokens(bucket)
        configs = kernel.space.enumerate(problem, SPEC).valid[:per_bucket]
        trials = []
        for number, config in enumerate(configs):
            cost = kernel.cost(problem, config, SPEC)
            costs.append(cost)
            trials.append(TrialRecord(number, config_to_json(config), "ok", None,
                                      KNOWN.predict_us(cost, SPEC), 0.01, 10, None, None, None))
        trials.append(TrialRecord(len(trials), config_to_json(configs[0]), "failed",
                                  "wrong result", None, None, None, None, None, None))
        now = datetime(2026, 12, 3, tzinfo=UTC)
        record_tuning_result(db, fingerprint, TuningResult(
            "rmsnorm", kernel.source_hash(), static.static_key(), bucket, bucket,
            f"rmsnorm-{bucket}", now, now, tuple(trials), None))
    return costs
