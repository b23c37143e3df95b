"""Trials in worker processes: compiled by the pool, verified and timed by the GPU worker, each
under a deadline.

The process that owns the study and the database never compiles or launches a kernel: a point
that hangs, crashes or poisons the CUDA context costs the worker (killed and started again) and
becomes a failed trial with its reason. A trial's deadline is the configured minimum plus ten
times the GPU time its measurement takes at the roofline's predicted speed, so a point slower
than predicted is timed, and one that never finishes is stopped.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutetune.build.artifacts import ARTIFACTS_DIR, ArtifactStore, arch_for
from cutetune.build.compile_pool import COMPILE_TIMEOUT_S, CompilePool, CompileResult
from cutetune.build.interrupt import raise_if_interrupted
from cutetune.build.supervised import ProcessLost, SupervisedProcess
from cutetune.device.measure import (
    MAX_INPUT_SETS,
    REPEATS,
    TARGET_GRAPH_US,
    WARMUP_REPLAYS,
    Measurement,
)
from cutetune.device.roofline import predict
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.registry import KernelDef
from cutetune.results_db.fingerprint import serves_here
from cutetune.spaces.problem import Problem
from cutetune.tuner.defaults import DEFAULT_TRIAL_TIMEOUT_S
from cutetune.tuner.study import TrialFailure

SLOWDOWN_ALLOWED = 10.0
CEILINGS_TIMEOUT_S = 300.0
GPU_WORKER = "cutetune.tuner.gpu_worker:GpuWorker"
COMPILER = "cutetune.build.compile_pool:CompileHandler"


def default_compile_processes() -> int:
    """All CPUs but a few, which the GPU worker's host side (graph capture) and this process
    need."""
    return max(1, (os.cpu_count() or 2) - 4)


def trial_gpu_seconds(predicted_us: float) -> float:
    """GPU time of one trial at the predicted speed, counted generously: four timing graphs (a
    decode-sized point is timed between two timings of the reference), each replayed
    REPEATS + WARMUP_REPLAYS + 3 times at its largest size."""
    graph_us = max(TARGET_GRAPH_US, predicted_us * MAX_INPUT_SETS)
    return 4 * (REPEATS + WARMUP_REPLAYS + 3) * graph_us * 1e-6


@dataclass
class TimeSplit:
    """Where a tuning run's time went: the GPU workers verifying and timing, waiting for a
    compile (each summed over the workers), and the compile pool's CPU time (summed over its
    processes). The workers' threads add to it at once: `add` holds a lock."""

    gpus: int = 1
    verify_s: float = 0.0
    timing_s: float = 0.0
    compile_wait_s: float = 0.0
    compile_cpu_s: float = 0.0
    workers_lost: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, verify_s: float = 0.0, timing_s: float = 0.0,
            compile_wait_s: float = 0.0) -> None:
        with self._lock:
            self.verify_s += verify_s
            self.timing_s += timing_s
            self.compile_wait_s += compile_wait_s

    @property
    def wall_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def gpu_idle_s(self) -> float:
        """GPU time (wall time on each GPU) in which its worker was neither verifying nor
        timing."""
        return max(0.0, self.gpus * self.wall_s - self.verify_s - self.timing_s)


class MixedGpusError(ValueError):
    """The GPUs of one run are of different models."""


class Workers:
    """The processes of one tuning run: a GPU worker per GPU, the compile pool, and the
    artifact store between them. Use as a context manager. The GPU workers come up first (the
    run needs their device's fingerprint, and the pool compiles for its arch); the pool comes
    up with the first compile, so a run with nothing left to tune starts none.

    `gpus`: the CUDA devices (as torch numbers them here) to run a worker on, one each, all of
    one GPU model; None: one worker, on the device this process would use."""

    def __init__(self, cache_dir: Path, kernel_modules: Sequence[str], seed: int = 0,
                 compile_processes: int | None = None,
                 trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
                 compile_timeout_s: float = COMPILE_TIMEOUT_S,
                 gpu_worker: str = GPU_WORKER, compiler: str = COMPILER,
                 gpus: Sequence[int] | None = None):
        self.directory = cache_dir / ARTIFACTS_DIR
        self.kernel_modules = tuple(kernel_modules)
        self.trial_timeout_s = trial_timeout_s
        self.gpu_numbers = tuple(gpus) if gpus is not None else None
        self.split = TimeSplit(gpus=len(gpus) if gpus is not None else 1)
        self.compile_processes = compile_processes or default_compile_processes()
        self._compile_timeout_s = compile_timeout_s
        self._compiler = compiler
        arguments = (str(self.directory), self.kernel_modules, seed)
        self.gpus = tuple(SupervisedProcess(gpu_worker, arguments, environment)
                          for environment in _worker_environments(gpus))
        self._pool: CompilePool | None = None
        self._pool_started = threading.Lock()  # the GPU workers' threads may ask at once
        self.fingerprint = None

    def __enter__(self) -> Workers:
        fingerprints = [gpu.start() for gpu in self.gpus]
        self.fingerprint = fingerprints[0]
        # A winner measured on one GPU must be one the others may serve: one GPU model.
        for number, fingerprint in zip(self.gpu_numbers or (0,), fingerprints, strict=True):
            if not serves_here(fingerprint, self.fingerprint):
                self.__exit__(None, None, None)
                raise MixedGpusError(f"GPU {number} is {_described(fingerprint)} but GPU "
                                     f"{self.gpu_numbers[0]} {_described(self.fingerprint)}: "
                                     "one run tunes GPUs of one model")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pool is not None:
            self._pool.close()
            self.split.compile_cpu_s = self._pool.cpu_seconds
        self.split.workers_lost = sum(gpu.losses for gpu in self.gpus)
        for gpu in self.gpus:
            gpu.stop()
        self.split.ended = time.monotonic()

    def measure_ceilings(self) -> dict[str, float]:
        return self.gpus[0].call(("ceilings",), CEILINGS_TIMEOUT_S)

    @property
    def pool(self) -> CompilePool:
        with self._pool_started:
            if self._pool is None:
                store = ArtifactStore(self.directory,
                                      arch_for(self.fingerprint.compute_capability))
                self._pool = CompilePool(store, self.compile_processes, self.kernel_modules,
                                         self._compile_timeout_s, self._compiler)
        return self._pool

    def compile_ahead(self, kernel: KernelDef, problem: Problem,
                      configs: Sequence[Any]) -> list[Future[CompileResult]]:
        return [self.pool.submit(kernel, problem, config, ahead=True) for config in configs]

    def runner(self, kernel: KernelDef, problem: Problem, spec: DeviceSpec,
               ceilings: Ceilings, gpu: int = 0) -> IsolatedTrialRunner:
        """The runner of one bucket on the run's `gpu`-th worker."""
        return IsolatedTrialRunner(self, kernel, problem, spec, ceilings, self.gpus[gpu])


def _described(fingerprint) -> str:
    return (f"a {fingerprint.gpu_name} (compute capability {fingerprint.compute_capability}, "
            f"{fingerprint.sm_count} SMs, CuTeDSL {fingerprint.cutlass_dsl})")


def _worker_environments(gpus: Sequence[int] | None) -> list[dict[str, str]]:
    """Each worker's environment: only its GPU visible (as this process numbers the GPUs,
    within the CUDA_VISIBLE_DEVICES it was started with)."""
    if gpus is None:
        return [{}]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else None
    return [{"CUDA_VISIBLE_DEVICES": names[number] if names else str(number)}
            for number in gpus]


class IsolatedTrialRunner:
    """The TrialRunner of one problem at one bucket, over the run's workers: its trials and
    its finalists' re-measurement all on one GPU worker, `gpu`."""

    def __init__(self, workers: Workers, kernel: KernelDef, problem: Problem,
                 spec: DeviceSpec, ceilings: Ceilings, gpu: SupervisedProcess):
        self.workers = workers
        self.kernel = kernel
        self.problem = problem
        self.spec = spec
        self.ceilings = ceilings
        self.gpu = gpu

    def deadline_s(self, config: Any) -> float:
        predicted = predict(self.kernel.cost(self.problem, config, self.spec), self.spec,
                            self.ceilings).predicted_us
        return self.workers.trial_timeout_s + SLOWDOWN_ALLOWED * trial_gpu_seconds(predicted)

    def _compiled(self, config: Any) -> None:
        """Wait for the point's artifact; TrialFailure when it could not be compiled."""
        future = self.workers.pool.submit(self.kernel, self.problem, config)
        start = time.monotonic()
        while True:
            try:
                result = future.result(timeout=0.5)
                break
            except TimeoutError:
                raise_if_interrupted()
        self.workers.split.add(compile_wait_s=time.monotonic() - start)
        if result.failure is not None:
            raise TrialFailure(result.failure)

    def measure(self, config: Any) -> Measurement:
        self._compiled(config)
        try:
            reply = self.gpu.call(("measure", self.kernel.name, self.problem, config),
                                  self.deadline_s(config))
        except ProcessLost as lost:
            raise TrialFailure(str(lost)) from None
        self.workers.split.add(verify_s=reply.verify_s, timing_s=reply.timing_s)
        if reply.failure is not None:
            raise TrialFailure(reply.failure)
        return reply.measurement

    def remeasure(self, configs: Sequence[Any]) -> list[Measurement]:
        """Raises ProcessLost if the worker is lost: the bucket then ends without a winner
        stored, and a later run tunes it again."""
        timeout = self.workers.trial_timeout_s + sum(self.deadline_s(c) for c in configs)
        measured, timing_s = self.gpu.call(
            ("remeasure", self.kernel.name, self.problem, list(configs)), timeout)
        self.workers.split.add(timing_s=timing_s)
        return measured
