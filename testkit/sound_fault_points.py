"""The fault kernel (fault_kernel.py) with its faulty points quarantined beforehand, so that a
run with the fake GPU worker tries only its three sound points: for tests of what a run reports
as it goes (its ETA, the ETA benchmark's readings)."""

from __future__ import annotations

from datetime import UTC, datetime

from cutetune.results_db import Database, QuarantinedPoint, record_quarantine
from cutetune.spaces.space import config_to_json
from cutetune.tuner.model_run import Unit
from testkit.fault_kernel import FAKE_FINGERPRINT, FAULTY_POINTS, KERNEL, FaultProblem

UNITS = (Unit(KERNEL, FaultProblem(num_tokens=1)),)


def sound_points_only(db: Database) -> None:
    for config in FAULTY_POINTS:
        record_quarantine(db, FAKE_FINGERPRINT, QuarantinedPoint(
            KERNEL.name, KERNEL.source_hash(), FaultProblem(num_tokens=1).static_key(),
            config_to_json(config), 1, "kept out by the test", datetime.now(UTC)))
