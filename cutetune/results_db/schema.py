"""Tables of the results database.

Timestamps are stored as naive UTC and come back as aware UTC datetimes, so SQLite (which keeps
no time zone) and PostgreSQL return the same values.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, MetaData, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A DateTime column that accepts aware datetimes only and returns them in UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # A naive time would be read back as UTC whatever zone it was taken in.
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} cannot be stored: give it a tz")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    # Named constraints give migrations stable names to refer to on every backend.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {datetime: UTCDateTime}


class DeviceRow(Base):
    """One device fingerprint: the GPU and the software stack a measurement was taken with."""

    __tablename__ = "devices"
    __table_args__ = (
        UniqueConstraint(
            "gpu_name", "compute_capability", "sm_count", "driver", "cuda", "torch", "cutlass_dsl"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_name: Mapped[str]
    compute_capability: Mapped[str]
    sm_count: Mapped[int]
    driver: Mapped[str]
    cuda: Mapped[str]
    torch: Mapped[str]
    cutlass_dsl: Mapped[str]


class KernelRow(Base):
    """A kernel at one version of its source: an edited kernel does not inherit old winners."""

    __tablename__ = "kernels"
    __table_args__ = (UniqueConstraint("name", "source_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    source_hash: Mapped[str]


class ProblemRow(Base):
    """The static part of a kernel's problem, as canonical JSON (`Problem.static_key()`)."""

    __tablename__ = "problems"
    __table_args__ = (UniqueConstraint("kernel_name", "static_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_name: Mapped[str]
    static_key: Mapped[str] = mapped_column(Text)


class CeilingRow(Base):
    """A ceiling measured on a device, such as "copy_gbps" or "launch_floor_us"."""

    __tablename__ = "ceilings"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    name: Mapped[str]
    value: Mapped[float]
    measured_at: Mapped[datetime]


class TuningRunRow(Base):
    """One tuning study of one kernel, problem and token bucket on one device."""

    __tablename__ = "tuning_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    bucket: Mapped[int]
    num_tokens: Mapped[int]
    study_name: Mapped[str]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]

    trials: Mapped[list[TrialRow]] = relationship()


class TrialRow(Base):
    """One point tried in a run: its measurement, or the reason it failed."""

    __tablename__ = "tuning_trials"
    __table_args__ = (
        UniqueConstraint("run_id", "number"),
        CheckConstraint("status IN ('ok', 'failed')", name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id"), index=True)
    number: Mapped[int]
    config_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str]
    failure_reason: Mapped[str | None] = mapped_column(Text)
    median_us: Mapped[float | None]
    iqr_us: Mapped[float | None]
    repeats: Mapped[int | None]
    gbps: Mapped[float | None]
    pct_roofline: Mapped[float | None]
    predicted_us: Mapped[float | None]


class WinnerRow(Base):
    """The best config known for one (kernel, problem, device, bucket), and where it came from."""

    __tablename__ = "winners"
    __table_args__ = (UniqueConstraint("kernel_id", "problem_id", "device_id", "bucket"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    bucket: Mapped[int]
    config_json: Mapped[str] = mapped_column(Text)
    median_us: Mapped[float]
    iqr_us: Mapped[float | None]
    gbps: Mapped[float | None]
    pct_roofline: Mapped[float | None]
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuning_trials.id"))
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id"))
    updated_at: Mapped[datetime]


class QuarantineRow(Base):
    """A point that hung, crashed its process or lost its CUDA context while being tuned: not
    tried again for this kernel source, problem and device unless asked to."""

    __tablename__ = "quarantine"
    __table_args__ = (UniqueConstraint("kernel_id", "problem_id", "device_id", "config_json"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    config_json: Mapped[str] = mapped_column(Text)
    bucket: Mapped[int]
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime]


class BenchRow(Base):
    """One implementation's time on one problem, from `cutetune bench` (ours against peers)."""

    __tablename__ = "bench_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    kernel_name: Mapped[str]
    static_key: Mapped[str] = mapped_column(Text)
    num_tokens: Mapped[int]
    implementation: Mapped[str]
    median_us: Mapped[float]
    gbps: Mapped[float]
    pct_of_copy: Mapped[float | None]
    measured_at: Mapped[datetime]


class CalibrationRow(Base):
    """The calibrated cost model fitted to a device's trials (`cutetune calibrate`): its form
    and constants as JSON (cutetune.device.calibrated.CalibratedModel), the latest one read."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    form: Mapped[str]
    params_json: Mapped[str] = mapped_column(Text)
    trials: Mapped[int]
    fitted_at: Mapped[datetime]


class BucketClaimRow(Base):
    """A bucket a tuner is searching now: its owner keeps the claim alive with a heartbeat
    until the bucket is stored; a claim whose lease has expired (its owner died) is taken over
    by another tuner, which continues the bucket's study from its stored trials."""

    __tablename__ = "bucket_claims"
    __table_args__ = (UniqueConstraint("kernel_id", "problem_id", "device_id", "bucket"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    bucket: Mapped[int]
    owner: Mapped[str] = mapped_column(Text)
    claimed_at: Mapped[datetime]
    expires_at: Mapped[datetime]
