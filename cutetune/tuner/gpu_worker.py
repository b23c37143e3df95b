"""What the GPU worker process runs: verify and time the points the tuner sends it.

The worker loads each point from the artifact store (the compile pool wrote it), keeps the input
sets of the bucket in hand, and answers with a measurement or the reason the point failed. When
a point leaves the CUDA context unusable (a trap, an illegal address, a launch failure), every
later launch in the process would fail too: the worker raises Fatal and the parent starts a new
one. Requests are tuples: ("ceilings",), ("measure", kernel name, problem, config) and
("remeasure", kernel name, problem, configs).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutetune.build.artifacts import ArtifactStore, arch_for
from cutetune.build.compiled import CompiledPoints
from cutetune.build.supervised import Fatal
from cutetune.device.measure import Measurement
from cutetune.spaces.problem import Problem


@dataclass(frozen=True)
class TrialReply:
    """A point's measurement, or the reason it failed; and the seconds spent verifying and
    timing it."""

    measurement: Measurement | None
    failure: str | None
    verify_s: float
    timing_s: float


class GpuWorker:
    def __init__(self, directory: str, kernel_modules: Sequence[str], seed: int):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("the GPU worker sees no CUDA device")
        for module in kernel_modules:
            importlib.import_module(module)
        from cutetune.device.specs import device_spec_for

        major, minor = torch.cuda.get_device_capability()
        self.store = ArtifactStore(Path(directory), arch_for(f"{major}.{minor}"))
        self.spec = device_spec_for(torch.cuda.get_device_name())
        self.seed = seed
        self._loaded = CompiledPoints(self._load)
        self._runner = None

    def hello(self):
        from cutetune.results_db.fingerprint import DeviceFingerprint

        return DeviceFingerprint.current()

    def __call__(self, request: tuple) -> Any:
        verb, *arguments = request
        return getattr(self, verb)(*arguments)

    def ceilings(self) -> dict[str, float]:
        from cutetune.device.ceilings import measure_ceilings

        return measure_ceilings()

    def measure(self, kernel_name: str, problem: Problem, config: Any) -> TrialReply:
        from cutetune.tuner.study import TrialFailure

        runner = self._runner_for(kernel_name, problem)
        verify_s, timing_s = runner.verify_s, runner.timing_s
        try:
            measurement, failure = runner.measure(config), None
        except TrialFailure as err:
            self._raise_if_context_lost()
            measurement, failure = None, str(err)
        except Exception:
            self._raise_if_context_lost()
            raise
        return TrialReply(measurement, failure, runner.verify_s - verify_s,
                          runner.timing_s - timing_s)

    def remeasure(self, kernel_name: str, problem: Problem,
                  configs: Sequence[Any]) -> tuple[list[Measurement], float]:
        runner = self._runner_for(kernel_name, problem)
        timing_s = runner.timing_s
        try:
            measured = runner.remeasure(configs)
        except Exception:
            self._raise_if_context_lost()
            raise
        return measured, runner.timing_s - timing_s

    def _runner_for(self, kernel_name: str, problem: Problem):
        """One bucket's runner at a time: its input sets can take gigabytes."""
        from cutetune.kernels.registry import get_kernel
        from cutetune.tuner.trials import GpuTrialRunner

        runner = self._runner
        if runner is None or (runner.kernel.name, runner.problem) != (kernel_name, problem):
            self._runner = GpuTrialRunner(get_kernel(kernel_name), problem, self.spec,
                                          self.seed, compile_point=self._loaded.get)
        return self._runner

    def _load(self, kernel, problem: Problem, config: Any) -> Any:
        """A point from the artifact store, compiled here (and stored) where it is missing: the
        worker times the file that will be served."""
        loaded = self.store.load(kernel, problem, config)
        if loaded is None:
            self.store.compile(kernel, problem, config)
            loaded = self.store.load(kernel, problem, config)
        return loaded

    @staticmethod
    def _raise_if_context_lost() -> None:
        """Fatal with the CUDA error if this process can no longer run anything on the GPU."""
        import torch

        from cutetune.build.errors import first_line

        try:
            torch.cuda.synchronize()
            torch.ones(1, device="cuda").add_(1).item()
        except Exception as lost:  # any error of the probe means the context is gone
            raise Fatal(f"cuda: {first_line(lost).removeprefix('CUDA error: ')}") from None
