"""Compiles ahead of the GPU: CPU-only processes that compile points into the artifact store.

CuTeDSL's compile is CPU work and is not thread-safe, so each compile runs in a process of its
own (supervised: a compile that crashes or hangs costs that process, not the run). The tuner
queues the points a study will surely try (its warm start) for every bucket ahead of time, and
asks for TPE's proposals as they come; an asked-for point goes ahead of the queued ones, so the
GPU worker waits on the compiler as little as the CPUs allow.
"""

from __future__ import annotations

import importlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutetune.build.artifacts import ArtifactStore
from cutetune.build.supervised import ProcessLost, SupervisedProcess
from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem

COMPILE_TIMEOUT_S = 300.0
_ASKED, _AHEAD = 0, 1  # queue priorities: a point a study waits for, a point compiled ahead


@dataclass(frozen=True)
class FinishedCompile:
    """One compile the pool ran: its kernel, its seconds, and when it finished
    (time.monotonic), for what a run's compiles cost by kernel (benchmarks/tune_eta.py)."""

    kernel: str
    seconds: float
    finished_at: float


@dataclass(frozen=True)
class CompileResult:
    """`failure` is None when the point's artifact is stored; `seconds` is the compile time
    (0 for an artifact found stored)."""

    failure: str | None
    seconds: float


class CompileHandler:
    """What a compile process runs: compile one point into the store, or say why it failed."""

    def __init__(self, directory: str, arch: str, kernel_modules: Sequence[str]):
        for module in kernel_modules:  # each kernel registers itself on import
            importlib.import_module(module)
        self.store = ArtifactStore(Path(directory), arch)

    def hello(self) -> int:
        return os.getpid()

    def __call__(self, request: tuple[str, Problem, Any]) -> CompileResult:
        from cutlass.base_dsl.common import DSLBaseError

        from cutetune.build.errors import first_line
        from cutetune.kernels.registry import get_kernel

        name, problem, config = request
        start = time.perf_counter()
        try:
            self.store.compile(get_kernel(name), problem, config)
            failure = None
        except DSLBaseError as err:
            failure = f"compile failed: {first_line(err)}"
        return CompileResult(failure, time.perf_counter() - start)


class CompilePool:
    """`processes` compile processes fed from one queue, each by a thread of this process."""

    def __init__(self, store: ArtifactStore, processes: int, kernel_modules: Sequence[str],
                 timeout_s: float = COMPILE_TIMEOUT_S,
                 handler: str = "cutetune.build.compile_pool:CompileHandler"):
        self.store = store
        self.timeout_s = timeout_s
        self.cpu_seconds = 0.0  # the compiles', summed over processes
        self.start_seconds = 0.0  # the processes' start-up (imports), summed over processes
        self.finished: list[FinishedCompile] = []  # in the order they finished
        self._futures: dict[str, Future[CompileResult]] = {}
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        # The processes see no GPU, and are told the target arch: CuTeDSL otherwise asks the
        # driver for it at the first compile, which, with no GPU visible, stalls each process
        # for over a minute when many start together.
        self._processes = [
            SupervisedProcess(handler, (str(store.directory), store.arch, tuple(kernel_modules)),
                              {"CUDA_VISIBLE_DEVICES": "", "CUTE_DSL_ARCH": store.arch})
            for _ in range(processes)]
        self._threads = [threading.Thread(target=self._serve, args=(process,), daemon=True)
                         for process in self._processes]
        for thread in self._threads:
            thread.start()

    def submit(self, kernel: KernelDef, problem: Problem, config: Any,
               ahead: bool = False) -> Future[CompileResult]:
        """The future result of compiling one point (once per point and pool); `ahead` queues
        it behind every point a study is waiting for."""
        key = self.store.key(kernel, problem, config)
        with self._lock:
            future = self._futures.get(key)
            if future is not None and (ahead or future.done()):
                return future
            new = future is None
            if new:
                future = self._futures[key] = Future()
        if new and self.store.find(kernel, problem, config) is not None:
            future.set_result(CompileResult(None, 0.0))
            return future
        # A point queued ahead and now waited for is queued again at the front; the first copy
        # a process takes is compiled, the other is dropped.
        self._queue.put((_AHEAD if ahead else _ASKED, next(self._order),
                         (key, kernel.name, problem, config, future)))
        return future

    def close(self) -> None:
        """Stop the processes once each has finished the compile in hand."""
        for _ in self._threads:
            self._queue.put((_AHEAD + 1, next(self._order), None))
        for thread in self._threads:
            thread.join()

    def _serve(self, process: SupervisedProcess) -> None:
        try:
            while True:
                job = self._queue.get()[2]
                if job is None:
                    return
                key, name, problem, config, future = job
                with self._lock:
                    if key in self._taken:
                        continue
                    self._taken.add(key)
                if not process.alive:
                    began = time.perf_counter()
                    try:
                        process.start()
                    except RuntimeError as err:  # it did not come up: the waiting caller raises
                        future.set_exception(err)
                        continue
                    with self._lock:
                        self.start_seconds += time.perf_counter() - began
                start = time.perf_counter()
                try:
                    result = process.call((name, problem, config), self.timeout_s)
                except ProcessLost as lost:
                    result = CompileResult(f"{lost} while compiling",
                                           time.perf_counter() - start)
                except BaseException as err:  # a bug in the handler: the waiting study raises it
                    future.set_exception(err)
                    continue
                with self._lock:
                    self.cpu_seconds += result.seconds
                    self.finished.append(FinishedCompile(name, result.seconds, time.monotonic()))
                future.set_result(result)
        finally:
            process.stop()
