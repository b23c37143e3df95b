"""Every GPU test's compiles, once per point for the whole run, and in parallel where a test
asks for many points at once.

Compiling dominates the GPU suite (0.3-1 s of CPU a point, a launch takes microseconds), and
several tests use the same points. One compile serves every token count, so a point is keyed by
the kernel, the problem's static part and the config. Every point goes through one artifact
store for the run, shared by pytest-xdist's workers (`-n 8`): a point one worker compiled, the
others load. `compile_all` spreads a test's points over the project's own compile pool (the
cores this worker's share of the machine spares, artifacts exported and loaded back as the tuner
does); a point the pool could not compile is compiled here, so its error reaches the test as it
would without the pool.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cutetune.spaces.space import config_to_json

_COMPILED: dict[tuple[str, str, str], Any] = {}
_STORE: list = []  # the run's ArtifactStore, in the directory `use_directory` names
_POOL: list = []  # this worker's CompilePool, started by the first compile_all that needs it
# Fewer points than this compile here: the pool's processes take seconds to start.
_POOL_THRESHOLD = 4


def _key(kernel, problem, config) -> tuple[str, str, str]:
    return kernel.name, problem.static_key(), config_to_json(config)


def compiled(kernel, problem, config) -> Any:
    """The callable `kernel.launch` takes for this point: loaded if any worker of this run has
    compiled it, else compiled here and stored for the others."""
    key = _key(kernel, problem, config)
    if key not in _COMPILED:
        _COMPILED[key] = _store().get(kernel, problem.with_tokens(1), config)
    return _COMPILED[key]


def compile_all(kernel, problem, configs: Iterable[Any]) -> None:
    """Compile the points not compiled yet, in the pool's processes, and load them here."""
    static = problem.with_tokens(1)
    missing = list(dict.fromkeys(c for c in configs if _key(kernel, problem, c) not in _COMPILED))
    if len(missing) < _POOL_THRESHOLD or _pool_processes() < 2:
        return
    pool = _pool()
    for future in [pool.submit(kernel, static, config) for config in missing]:
        future.result()
    for config in missing:
        loaded = pool.store.load(kernel, static, config)
        if loaded is not None:  # else the test's own compile raises the error
            _COMPILED[_key(kernel, problem, config)] = loaded


def use_directory(directory: Path) -> None:
    """Store this run's artifacts in `directory` (the same one in every worker)."""
    import torch

    from cutetune.build.artifacts import ArtifactStore, arch_for

    major, minor = torch.cuda.get_device_capability()
    _STORE[:] = [ArtifactStore(directory, arch_for(f"{major}.{minor}"))]


def _store():
    if not _STORE:
        raise RuntimeError("compiled_points: call use_directory first (tests/gpu/conftest.py)")
    return _STORE[0]


def _pool_processes() -> int:
    """This worker's share of the cores, less one for the worker itself and the GPU."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return (os.cpu_count() or 2) // workers - 1


def _pool():
    if not _POOL:
        from cutetune.build.compile_pool import CompilePool

        _POOL.append(CompilePool(_store(), _pool_processes(), ()))
    return _POOL[0]


def close_pool() -> None:
    """Stop this worker's pool, if it started one."""
    while _POOL:
        _POOL.pop().close()
