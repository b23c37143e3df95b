"""Fixtures of the results_db contract tests: a database per backend, devices, tuning results."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from cutetune.results_db import Database, DeviceFingerprint, TrialRecord, TuningResult

# Qwen3-8B's per-head QK-norm, as `Problem.static_key()` writes it.
QWEN3_8B_QK_NORM = json.dumps(
    {"dtype": "bfloat16", "eps": 1e-6, "head_dim": 128, "num_kv_heads": 8, "num_q_heads": 32},
    sort_keys=True,
)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    """An empty results database on each backend (tests/conftest.py's database_url)."""
    database = Database.open(database_url)
    yield database
    database.dispose()


@pytest.fixture
def h200() -> DeviceFingerprint:
    return DeviceFingerprint(
        gpu_name="NVIDIA H200",
        compute_capability="9.0",
        sm_count=132,
        driver="570.133",
        cuda="12.8",
        torch="2.9.0",
        cutlass_dsl="4.8.1",
    )


@pytest.fixture
def h100(h200: DeviceFingerprint) -> DeviceFingerprint:
    return dataclasses.replace(h200, gpu_name="NVIDIA H100 80GB HBM3")


def _config_json(warps: int) -> str:
    return json.dumps({"vector_width": 8, "warps_per_block": warps}, sort_keys=True)


def _ok_trial(number: int, median_us: float, warps: int) -> TrialRecord:
    return TrialRecord(
        number=number,
        config_json=_config_json(warps),
        status="ok",
        failure_reason=None,
        median_us=median_us,
        iqr_us=median_us / 50,
        repeats=100,
        gbps=4000.0 / median_us,
        pct_roofline=95.0 / median_us,
        predicted_us=median_us * 0.9,
    )


def _failed_trial(number: int, warps: int, reason: str) -> TrialRecord:
    return TrialRecord(
        number=number,
        config_json=_config_json(warps),
        status="failed",
        failure_reason=reason,
        median_us=None,
        iqr_us=None,
        repeats=None,
        gbps=None,
        pct_roofline=None,
        predicted_us=None,
    )


@pytest.fixture
def ok_trial() -> Callable[[int, float, int], TrialRecord]:
    """Build a measured trial: `ok_trial(number, median_us, warps)`."""
    return _ok_trial


@pytest.fixture
def failed_trial() -> Callable[[int, int, str], TrialRecord]:
    """Build a failed trial: `failed_trial(number, warps, reason)`."""
    return _failed_trial


@pytest.fixture
def make_result() -> Callable[..., TuningResult]:
    """Build a run whose winner is trial 0 (`warps` warps, `median_us`), beaten by nothing:
    trial 1 is three times slower and trial 2 failed verification."""

    def make(
        *,
        median_us: float = 2.0,
        warps: int = 4,
        kernel_name: str = "qk_norm",
        source_hash: str = "5f1e0c",
        static_key: str = QWEN3_8B_QK_NORM,
        bucket: int = 16,
    ) -> TuningResult:
        started_at = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
        return TuningResult(
            kernel_name=kernel_name,
            source_hash=source_hash,
            static_key=static_key,
            bucket=bucket,
            num_tokens=bucket,
            study_name=f"{kernel_name}-{bucket}",
            started_at=started_at,
            finished_at=started_at + timedelta(minutes=3),
            trials=(
                _ok_trial(0, median_us, warps),
                _ok_trial(1, median_us * 3, warps=1),
                _failed_trial(2, warps=32, reason="max abs error 0.5 > tolerance 0.02"),
            ),
            winner_number=0,
        )

    return make
