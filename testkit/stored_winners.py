"""Hand-made Winner records for tests of what serves them (dispatcher, bench)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cutetune.kernels.registry import KernelDef
from cutetune.results_db import Winner
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json


def winner(kernel: KernelDef, problem: Problem, bucket: int, config: Any,
           source_hash: str | None = None) -> Winner:
    return Winner(
        kernel_name=kernel.name,
        source_hash=kernel.source_hash() if source_hash is None else source_hash,
        static_key=problem.static_key(),
        bucket=bucket,
        config_json=config_to_json(config),
        median_us=1.0,
        iqr_us=0.01,
        gbps=100.0,
        pct_roofline=50.0,
        updated_at=datetime.now(UTC),
    )
