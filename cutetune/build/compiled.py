"""The compiled points of one owner in this process, each made ready once.

One compile serves every token count of a static problem, so a point is keyed by its kernel,
static problem and config. What makes a point ready is the owner's: the dispatcher (and the
bench through it) loads it from the artifact cache or compiles it, a trial runner compiles it
here, and the GPU worker runs the artifact file a compile process stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

# (kernel, problem, config) -> the callable `kernel.launch` takes.
MakePoint = Callable[[KernelDef, Problem, Any], Any]


def compile_here(kernel: KernelDef, problem: Problem, config: Any) -> Any:
    return kernel.compile(problem, config)


class CompiledPoints:
    def __init__(self, make: MakePoint = compile_here):
        self._make = make
        self._ready: dict[tuple[str, str, str], Any] = {}

    def get(self, kernel: KernelDef, problem: Problem, config: Any) -> Any:
        """The point ready to launch, made the first time it is asked for."""
        key = (kernel.name, problem.static_key(), config_to_json(config))
        if key not in self._ready:
            self._ready[key] = self._make(kernel, problem, config)
        return self._ready[key]

    def __len__(self) -> int:
        return len(self._ready)
