"""Storing in the artifact cache every point a plan serves, before anything is served: the
points missing there are compiled in parallel processes, so that a cold start costs the
slowest compiles, not their sum (a warmup, and `cutetune cache build` on a machine without a
GPU)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cutetune.build.artifacts import ArtifactStore
from cutetune.kernels.registry import KernelDef
from cutetune.serving.plan import ServingPlan
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

log = logging.getLogger("cutetune.serving")


@dataclass
class ParallelCompiles:
    """What the compile pools did: the points they compiled and their wall time (their start
    included), and the seconds their processes spent starting and compiling, each summed over
    processes."""

    compiled: int = 0
    seconds: float = 0.0
    start_cpu_s: float = 0.0
    compile_cpu_s: float = 0.0


def precompile(plan: ServingPlan, store: ArtifactStore,
               work: Sequence[tuple[KernelDef, Sequence[Problem]]], processes: int,
               tally: ParallelCompiles | None = None) -> tuple[int, int]:
    """Store in `store` every point `plan` serves for `work` (kernels and their problems): those
    missing are compiled by up to `processes` processes in parallel (by this one where that is
    1), which `tally` adds up. Returns (points, compiled)."""
    # Which keys have a file, from one listing: each file is checked when it is loaded.
    stored = store.stored_keys()
    points, missing = set(), {}
    for kernel, problems in work:
        for problem in problems:
            for entry in plan.entries(kernel, problem):
                key = (kernel.name, problem.static_key(), config_to_json(entry.config))
                if key in points:
                    continue
                points.add(key)
                if store.key(kernel, problem, entry.config) not in stored:
                    missing[key] = (kernel, problem, entry.config)
    if len(missing) < 2 or processes < 2:
        for point in missing.values():
            store.compile(*point)
        return len(points), len(missing)
    from cutetune.build.compile_pool import CompilePool

    modules = sorted({kernel.compile_function.__module__ for kernel, _ in work})
    start = time.perf_counter()
    pool = CompilePool(store, min(processes, len(missing)), modules)
    try:
        futures = [pool.submit(*point) for point in missing.values()]
        failures = [failure for f in futures if (failure := f.result().failure)]
    finally:
        pool.close()
    if failures:  # the point compiles again when it is served, which raises its error
        log.warning("cutetune: %d of %d points failed to compile in parallel: %s",
                    len(failures), len(missing), failures[0])
    if tally is not None:
        tally.start_cpu_s += pool.start_seconds
        tally.compile_cpu_s += pool.cpu_seconds
        tally.compiled += len(missing) - len(failures)
        tally.seconds += time.perf_counter() - start
    return len(points), len(missing) - len(failures)
