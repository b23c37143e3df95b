"""Every GPU test's compiles, once per point for the whole session, and in parallel where a test
asks for many points at once.

Compiling dominates the GPU suite (0.3-1 s of CPU a point, a launch takes microseconds), and
several tests use the same points. One compile serves every token count, so a point is keyed by
the kernel, the problem's static part and the config. `compile_all` spreads a test's points over
the project's own compile pool (one process per spare core, artifacts exported and loaded back
as the tuner does); a point the pool could not compile is compiled here, so its error reaches
the test as it would without the pool.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cutetune.spaces.space import config_to_json

_COMPILED: dict[tuple[str, str, str], Any] = {}
_POOL: list = []  # the session's CompilePool, started by the first compile_all that needs it
# Fewer points than this compile here: the pool's processes take seconds to start.
_POOL_THRESHOLD = 4


def _key(kernel, problem, config) -> tuple[str, str, str]:
    return kernel.name, problem.static_key(), config_to_json(config)


def compiled(kernel, problem, config) -> Any:
    """The callable `kernel.launch` takes for this point, compiled at most once a session."""
    key = _key(kernel, problem, config)
    if key not in _COMPILED:
        _COMPILED[key] = kernel.compile(problem.with_tokens(1), config)
    return _COMPILED[key]


def compile_all(kernel, problem, configs: Iterable[Any]) -> None:
    """Compile the points not compiled yet, in the pool's processes, and load them here."""
    static = problem.with_tokens(1)
    missing = list(dict.fromkeys(c for c in configs if _key(kernel, problem, c) not in _COMPILED))
    if len(missing) < _POOL_THRESHOLD:
        return
    pool = _pool()
    for future in [pool.submit(kernel, static, config) for config in missing]:
        future.result()
    for config in missing:
        loaded = pool.store.load(kernel, static, config)
        if loaded is not None:  # else the test's own compile raises the error
            _COMPILED[_key(kernel, problem, config)] = loaded


def _pool():
    if not _POOL:
        import torch

        from cutetune.build.artifacts import ArtifactStore, arch_for
        from cutetune.build.compile_pool import CompilePool

        major, minor = torch.cuda.get_device_capability()
        directory = Path(tempfile.mkdtemp(prefix="cutetune-gpu-tests-"))
        store = ArtifactStore(directory, arch_for(f"{major}.{minor}"))
        # One core for this process and the GPU, the rest compile.
        _POOL.append(CompilePool(store, max(1, (os.cpu_count() or 2) - 1), ()))
    return _POOL[0]


def close_pool() -> None:
    """Stop the pool's processes, if any were started."""
    while _POOL:
        pool = _POOL.pop()
        pool.close()
        shutil.rmtree(pool.store.directory, ignore_errors=True)
