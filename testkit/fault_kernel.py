"""A test-only kernel whose points misbehave on request, for the tuner's fault isolation tests;
registered on import, never shipped.

Its points: behaviour "ok" at 1, 2 or 4 passes (1 pass is the fastest, 4 the default), and one
point per fault at 1 pass: compile_error, wrong, nan, trap, spin, slow (fault_kernel_device.py
has the CuTeDSL side). No model uses it: its problem is FaultProblem(num_tokens=...) itself.

FakeGpuWorker stands in for the GPU worker where there is no GPU, answering for each point what
the real worker answers on the H200; each point it measures is appended to `measured.log`
beside the artifact directory, so tests can tell what was timed and when.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from cutetune.build.artifacts import ArtifactStore
from cutetune.build.supervised import Fatal
from cutetune.device.measure import Measurement
from cutetune.kernels.cost import Cost
from cutetune.kernels.registry import KernelDef, NotApplicableError, register
from cutetune.results_db import DeviceFingerprint
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space, config_to_json
from cutetune.tuner.gpu_worker import TrialReply

COLUMNS = 1024
BEHAVIOURS = ("ok", "compile_error", "wrong", "nan", "trap", "spin", "slow")
FAULTS = {"compile_error": "compile failed", "wrong": "wrong result", "nan": "wrong result",
          "trap": "cuda:", "spin": "hang:"}
FAKE_FINGERPRINT = DeviceFingerprint("NVIDIA H200", "9.0", 132, "13.0", "13.0", "2.11", "4.8.1")
# Seconds the fake worker takes per trial (a test that kills a run mid-bucket sets it).
FAKE_TRIAL_SECONDS = "CUTETUNE_TEST_FAKE_TRIAL_SECONDS"


@dataclass(frozen=True, kw_only=True)
class FaultProblem(Problem):
    columns: int = COLUMNS


@dataclass(frozen=True)
class FaultConfig:
    behaviour: str
    passes: int


SPACE = Space(FaultConfig, (Param("behaviour", BEHAVIOURS), Param("passes", (1, 2, 4))), (
    Constraint("faults_at_one_pass", "a faulty behaviour is declared at one pass only",
               lambda problem, config, device: config.behaviour == "ok" or config.passes == 1),
))
OK_POINTS = tuple(FaultConfig("ok", p) for p in (1, 2, 4))
FAULTY_POINTS = tuple(FaultConfig(b, 1) for b in BEHAVIOURS if b != "ok")


def problems_for_model(model, dtype: str):
    raise NotApplicableError("fault_injection is a test kernel: no model uses it")


def default_config(problem: FaultProblem, spec) -> FaultConfig:
    return FaultConfig("ok", 4)


def cost(problem: FaultProblem, config: FaultConfig, spec) -> Cost:
    return Cost(bytes_moved=2 * 4 * problem.num_tokens * COLUMNS * config.passes, flops=0,
                blocks=problem.num_tokens, threads_per_block=COLUMNS, registers_per_thread=32)


def compile_kernel(problem: FaultProblem, config: FaultConfig, options: str = ""):
    from testkit.fault_kernel_device import compile_fault_kernel

    return compile_fault_kernel(config.behaviour, config.passes, options)


def launch(compiled, tensors) -> None:
    compiled(tensors["x"], tensors["out"])


def make_inputs(problem: FaultProblem, device, generator: torch.Generator):
    x = torch.randn((problem.num_tokens, COLUMNS), generator=generator, device=device)
    return {"x": x, "out": torch.empty_like(x)}


def reference(tensors, problem: FaultProblem):
    return {"out": tensors["x"].float() * 2}


KERNEL = register(KernelDef(
    name="fault_injection",
    description="test kernel: out = 2 x, or a fault on request",
    problem_type=FaultProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=compile_kernel,
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("out",),
    written_in_place=(),
    tolerance={"float32": (1e-6, 1e-6)},
    source_file=__file__,
))


def fake_us(config: FaultConfig, tokens: int) -> float:
    """The fake worker's time of an ok or slow point: distinct for every point."""
    if config.behaviour == "slow":
        return 200.0 + tokens / 100
    return 10.0 * config.passes + tokens / 100


class FakeGpuWorker:
    """The GPU worker's answers for the fault kernel's points, without a GPU: a spin hangs,
    a trap loses the 'CUDA context', a wrong or NaN result fails verification."""

    def __init__(self, directory: str, kernel_modules, seed: int):
        for module in kernel_modules:
            importlib.import_module(module)
        self.store = ArtifactStore(Path(directory), "sm_90a")
        self.log = Path(directory).parent / "measured.log"
        self.delay_s = float(os.environ.get(FAKE_TRIAL_SECONDS, "0"))

    def hello(self) -> DeviceFingerprint:
        return FAKE_FINGERPRINT

    def __call__(self, request: tuple):
        verb, *arguments = request
        return getattr(self, verb)(*arguments)

    def ceilings(self) -> dict[str, float]:
        return {"copy_gbps": 4000.0, "launch_floor_us": 2.0}

    def measure(self, kernel_name: str, problem: FaultProblem, config: FaultConfig):
        if self.store.find(KERNEL, problem, config) is None:
            raise RuntimeError(f"{config} sent to the GPU worker before its artifact was stored")
        time.sleep(self.delay_s)
        with self.log.open("a") as log:
            log.write(f"{os.getpid()} {problem.num_tokens} {config_to_json(config)}\n")
        if config.behaviour == "spin":
            time.sleep(3600)
        if config.behaviour == "trap":
            raise Fatal("cuda: unspecified launch failure")
        if config.behaviour in ("wrong", "nan"):
            return TrialReply(None, f"wrong result: out: {config.behaviour}", 0.01, 0.0)
        return TrialReply(Measurement(fake_us(config, problem.num_tokens), 0.01, 25), None,
                          0.01, 0.1)

    def remeasure(self, kernel_name: str, problem: FaultProblem, configs):
        return [Measurement(fake_us(c, problem.num_tokens) - 0.5, 0.01, 25)
                for c in configs], 0.2


class MixedGpus(FakeGpuWorker):
    """The fake worker of GPU 1 is another GPU model (as CUDA_VISIBLE_DEVICES tells it)."""

    def hello(self) -> DeviceFingerprint:
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
            return dataclasses.replace(FAKE_FINGERPRINT, gpu_name="NVIDIA H100 80GB HBM3")
        return FAKE_FINGERPRINT


class EveryPointWrong(FakeGpuWorker):
    def measure(self, kernel_name: str, problem: FaultProblem, config: FaultConfig):
        return TrialReply(None, "wrong result: out: every point", 0.01, 0.0)


class RemeasureHangs(FakeGpuWorker):
    def remeasure(self, kernel_name: str, problem: FaultProblem, configs):
        time.sleep(3600)


def measured_log(cache_dir: Path) -> list[tuple[int, int, str]]:
    """(worker pid, tokens, config JSON) of each point the fake worker measured."""
    path = cache_dir / "measured.log"
    if not path.exists():
        return []
    return [(int(pid), int(tokens), config) for pid, tokens, config in
            (line.split(" ", 2) for line in path.read_text().splitlines())]
