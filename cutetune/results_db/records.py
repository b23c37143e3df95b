"""Records that cross the results_db boundary: what the tuner stores and what queries return."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

STATUSES = ("ok", "failed")


@dataclass(frozen=True)
class TrialRecord:
    """One point of a tuning run: measured ("ok") or rejected with a reason ("failed").

    `config_json` is the config's canonical JSON (`config_to_json`): the winner rule compares
    configs by this text, so one config must always be written the same way.
    """

    number: int
    config_json: str
    status: str
    failure_reason: str | None
    median_us: float | None
    iqr_us: float | None
    repeats: int | None
    gbps: float | None
    pct_roofline: float | None
    predicted_us: float | None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"trial {self.number}: status {self.status!r} is not one of {STATUSES}"
            )
        if self.status == "ok" and self.median_us is None:
            raise ValueError(f"trial {self.number} is ok but has no median_us")
        if self.status == "failed" and not self.failure_reason:
            raise ValueError(f"trial {self.number} failed but has no failure_reason")
        try:
            config = json.loads(self.config_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"trial {self.number}: config_json is not JSON ({exc})") from None
        if not isinstance(config, dict) or json.dumps(config, sort_keys=True) != self.config_json:
            raise ValueError(
                f"trial {self.number}: config_json {self.config_json!r} is not the canonical JSON "
                "of an object (json.dumps(config, sort_keys=True))"
            )


@dataclass(frozen=True)
class TuningResult:
    """A finished tuning run of one kernel, problem and token bucket, with every trial.

    `winner_number` is the `number` of the winning trial, which must be an "ok" trial of
    `trials`; None when no trial succeeded.
    """

    kernel_name: str
    source_hash: str
    static_key: str
    bucket: int
    num_tokens: int
    study_name: str
    started_at: datetime
    finished_at: datetime
    trials: tuple[TrialRecord, ...]
    winner_number: int | None

    def __post_init__(self) -> None:
        numbers = [trial.number for trial in self.trials]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"{self.study_name}: trial numbers repeat: {sorted(numbers)}")
        for name in ("started_at", "finished_at"):
            if getattr(self, name).tzinfo is None:
                raise ValueError(f"{self.study_name}: {name} must carry a time zone")
        if self.winner_number is not None:
            ok = {trial.number for trial in self.trials if trial.status == "ok"}
            if self.winner_number not in ok:
                raise ValueError(
                    f"{self.study_name}: winner_number {self.winner_number} is not an ok trial "
                    f"(ok trials: {sorted(ok)})"
                )


@dataclass(frozen=True)
class Winner:
    """The best config stored for one (kernel, problem, bucket) on one device;
    `measured_elsewhere` names how that device's environment differs from the one asking
    (fingerprint.environment_differences), empty where it does not."""

    kernel_name: str
    source_hash: str
    static_key: str
    bucket: int
    config_json: str
    median_us: float
    iqr_us: float | None
    gbps: float | None
    pct_roofline: float | None
    updated_at: datetime
    measured_elsewhere: str = ""


@dataclass(frozen=True)
class BenchRecord:
    """One implementation's time on one problem, from `cutetune bench`."""

    kernel_name: str
    static_key: str
    num_tokens: int
    implementation: str
    median_us: float
    gbps: float
    pct_of_copy: float | None


@dataclass(frozen=True)
class QuarantinedPoint:
    """A point kept out of tuning, with the reason it took its process down."""

    kernel_name: str
    source_hash: str
    static_key: str
    config_json: str
    bucket: int
    reason: str
    recorded_at: datetime


@dataclass(frozen=True)
class StoredRun:
    """What is stored of one bucket's latest tuning run: its trial count, how many failed,
    and the bucket's winner (None when every point failed)."""

    bucket: int
    trials: int
    failed: int
    winner: Winner | None
