"""The GPU TrialRunner: compile, verify against the reference, time in a CUDA graph."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from cutlass.base_dsl.common import DSLBaseError

from cutetune.build.compiled import CompiledPoints, MakePoint
from cutetune.build.errors import first_line
from cutetune.device.measure import (
    DRIFT_CORRECTED_BELOW_US,
    Measurement,
    input_sets_for,
    time_in_graph,
    time_interleaved_draws,
    with_fresh_outputs,
)
from cutetune.device.specs import DeviceSpec
from cutetune.device.verify import verify
from cutetune.kernels.registry import KernelDef, VerificationError
from cutetune.spaces.problem import Problem
from cutetune.tuner.finals import FINAL_DRAWS
from cutetune.tuner.study import TrialFailure

# The runners of one tuning process (one per bucket) share their compiles.
_IN_PROCESS = CompiledPoints()


class GpuTrialRunner:
    """Runs the points of one problem; input sets are made once and shared by every point.
    `verify_s` and `timing_s` add up the time spent verifying and timing."""

    def __init__(self, kernel: KernelDef, problem: Problem, spec: DeviceSpec, seed: int = 0,
                 compile_point: MakePoint = _IN_PROCESS.get):
        self.kernel = kernel
        self.problem = problem
        self.spec = spec
        self.seed = seed
        self.compile_point = compile_point
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.verify_s = 0.0
        self.timing_s = 0.0
        self._input_sets = None
        self._reference_config = kernel.default_config(problem, spec)
        self._reference_first_us: float | None = None

    def compiled(self, config: Any):
        try:
            return self.compile_point(self.kernel, self.problem, config)
        except DSLBaseError as err:
            raise TrialFailure(f"compile failed: {first_line(err)}") from err

    def _inputs(self):
        if self._input_sets is None:
            working_set = self.kernel.cost(self.problem, self.kernel.default_config(
                self.problem, self.spec), self.spec).bytes_moved
            generator = torch.Generator(device=self.device).manual_seed(self.seed + 1)
            self._input_sets = [self.kernel.make_inputs(self.problem, self.device, generator)
                                for _ in range(input_sets_for(working_set, self.spec.l2_bytes))]
        return self._input_sets

    def _launches(self, compiled) -> list:
        """One launch per input set, each on fresh outputs, as `cutetune bench` launches."""
        kernel = self.kernel

        def run(tensors) -> None:
            kernel.launch(compiled, with_fresh_outputs(tensors, kernel.outputs,
                                                       kernel.written_in_place))

        return [lambda t=tensors: run(t) for tensors in self._inputs()]

    def _time(self, compiled) -> Measurement:
        return time_in_graph(self._launches(compiled))

    def _reference_us(self) -> float:
        return self._time(self.compiled(self._reference_config)).median_us

    def verified(self, config: Any):
        """The point compiled and checked against the reference; TrialFailure where it does
        not compile, launch or compute correctly."""
        compiled = self.compiled(config)
        start = time.perf_counter()
        with _as_trial_failure():
            verify(self.kernel, self.problem, compiled, self.device, self.seed)
        self.verify_s += time.perf_counter() - start
        return compiled

    def measure(self, config: Any) -> Measurement:
        compiled = self.verified(config)
        start = time.perf_counter()
        with _as_trial_failure():
            measured = self._timed(compiled)
        self.timing_s += time.perf_counter() - start
        return measured

    def _timed(self, compiled) -> Measurement:
        measured = self._time(compiled)
        if measured.median_us >= DRIFT_CORRECTED_BELOW_US:
            return measured
        if self._reference_first_us is None:
            self._reference_first_us = self._reference_us()
        before = self._reference_us()
        measured = self._time(compiled)
        after = self._reference_us()
        return drift_corrected(measured, (before + after) / 2, self._reference_first_us)

    def remeasure(self, configs: Sequence[Any], draws: int = FINAL_DRAWS) -> list[Measurement]:
        """The finalists timed side by side as `cutetune bench` times its candidates (every
        graph captured, then replayed in interleaved rounds), so that the tuner picks its
        winner by the measurement the bench will report; `draws` times, each on input sets
        allocated afresh while every earlier draw's are still held (so each at other
        addresses), their times pooled (tuner/finals.py says why)."""
        compiled = [self.compiled(c) for c in configs]
        held = []

        def draw() -> list[list]:
            held.append(self._input_sets)
            self._input_sets = None
            return [self._launches(c) for c in compiled]

        start = time.perf_counter()
        measured = time_interleaved_draws(draw, draws)
        self.timing_s += time.perf_counter() - start
        return measured


@contextlib.contextmanager
def _as_trial_failure() -> Iterator[None]:
    """A wrong result or a failed launch as the TrialFailure that stores its reason."""
    try:
        yield
    except VerificationError as err:
        raise TrialFailure(f"wrong result: {err}") from err
    except RuntimeError as err:  # CUDA launch errors surface as RuntimeError subclasses
        raise TrialFailure(f"launch failed: {first_line(err)}") from err


def drift_corrected(measured: Measurement, reference_now_us: float,
                    reference_first_us: float) -> Measurement:
    """The trial's time as if taken when the reference was first timed. Additive, because the
    state change looks like a fixed latency, not a rate: it moves a 1-token point and leaves
    a longer 8-token point where it was (docs/performance-notes.md, Measuring)."""
    shift = reference_now_us - reference_first_us
    return dataclasses.replace(measured, median_us=measured.median_us - shift)

