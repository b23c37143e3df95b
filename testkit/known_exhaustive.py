"""Exhaustive measurements (benchmarks.exhaustive's CSV) timed by the known cost model, for the
tests of what reads them: a row for every valid point of the models' problems at each token
count."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from benchmarks.exhaustive import COLUMNS, work
from cutetune.spaces.space import config_to_json
from testkit.known_cost_model import KNOWN, SPEC


def write_known_exhaustive(path: Path, models: Sequence[str], kernels: Sequence[str],
                           tokens: Sequence[int], leave_out_last: bool = False) -> Path:
    """The CSV at `path`; `leave_out_last` drops the last point, as a call that stopped inside
    a bucket leaves it."""
    points = list(work(models, kernels, tokens, SPEC))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for model, kernel, problem, config in points[:-1] if leave_out_last else points:
            writer.writerow({"model": model, "kernel_name": kernel.name,
                             "static_key": problem.static_key(), "bucket": problem.num_tokens,
                             "config_json": config_to_json(config), "status": "ok",
                             "median_us": KNOWN.predict_us(kernel.cost(problem, config, SPEC),
                                                           SPEC),
                             "iqr_us": 0.01, "failure_reason": ""})
    return path
