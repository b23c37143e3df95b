"""`cutetune bench`: ours beside what users would otherwise run, on the same tensors, in one run.

For each problem the candidates are: cutetune as the serving plan serves it on this device
(the tuned winner of the bucket, or of the nearest tuned bucket), cutetune's heuristic default,
torch eager (the kernel's fp32 reference cast to the output dtypes: how a torch user writes
it), torch.compile of that same function, the peers the kernel declares, and for a fused
kernel the unfused chain of our own kernels it replaces, each step served as the plan serves
it. Every candidate's
outputs are checked against the fp32 reference before it is timed; all are timed the same way
(CUDA-graph replay over the same rotated input sets, every output allocated per call, in
interleaved rounds, or one after another where their graphs together exceed the GPU's memory,
which the rows say); GB/s
counts the bytes the kernel must move (its roofline cost), and is given as a percentage of the
copy ceiling measured in the same run.
A last row times a plain copy of those same bytes the same way: the ceiling at that size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cutetune.build.compiled import CompiledPoints, compile_here
from cutetune.device.ceilings import measure_copy_gbps, measure_launch_floor_us, time_copy_of
from cutetune.device.measure import (
    INTERLEAVED_ROUNDS,
    Measurement,
    input_sets_for,
    time_in_graph,
    time_interleaved,
    with_fresh_outputs,
)
from cutetune.device.specs import DeviceSpec, device_spec_for
from cutetune.device.verify import check_outputs
from cutetune.kernels.registry import (
    KernelDef,
    NotApplicableError,
    PeerUnavailable,
    Tensors,
    VerificationError,
    get_kernel,
)
from cutetune.results_db import (
    BenchRecord,
    Database,
    DeviceFingerprint,
    record_bench,
    record_ceilings,
    shipped_winners,
    winners_to_serve,
)
from cutetune.serving.plan import BORROWED, DEFAULT, NEAREST, SHIPPED, ServingPlan, say_skipped
from cutetune.serving.warmup import artifact_store
from cutetune.spaces.buckets import bucket_of
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

TUNED_NAME = "cutetune tuned"
DEFAULT_NAME = "cutetune default"
UNFUSED_NAME = "cutetune unfused"
OURS = (TUNED_NAME, DEFAULT_NAME)
# A plain copy of the bytes the kernel must move: the ceiling at this size, not a peer.
COPY_NAME = "copy, same bytes"

Runner = Callable[[Tensors], Mapping[str, torch.Tensor]]


class BenchError(Exception):
    """One of our own implementations disagrees with the reference: a bug, not a result."""


@dataclass(frozen=True)
class Candidate:
    name: str
    run: Runner | None  # None: cannot run here; `note` says why
    note: str
    roundings: int = 1  # its outputs' roundings to their dtype (device/verify.check_outputs)


@dataclass(frozen=True)
class BenchRow:
    problem: Problem
    implementation: str
    median_us: float | None  # None: not timed; `note` says why
    iqr_us: float | None
    gbps: float | None
    pct_of_copy: float | None
    note: str


@dataclass(frozen=True)
class BenchRun:
    gpu_name: str
    copy_gbps: float
    empty_kernel_us: float
    rows: tuple[BenchRow, ...]


def ours_runner(kernel: KernelDef, problem: Problem, config: Any,
                points: CompiledPoints) -> Runner:
    compiled = points.get(kernel, problem, config)

    def run(tensors: Tensors) -> Mapping[str, torch.Tensor]:
        # Outputs allocated per call, as the peers' and torch's are (with_fresh_outputs).
        written = with_fresh_outputs(tensors, kernel.outputs, kernel.written_in_place)
        kernel.launch(compiled, written)
        return {name: written[name] for name in kernel.outputs}

    return run


def torch_eager(kernel: KernelDef, problem: Problem) -> Runner:
    """The reference math in fp32, each output cast to its buffer's dtype."""

    def run(tensors: Tensors) -> Mapping[str, torch.Tensor]:
        expected = kernel.reference(tensors, problem)
        return {name: expected[name].to(tensors[name].dtype) for name in kernel.outputs}

    return run


def unfused_chain(kernel: KernelDef, problem: Problem, plan: ServingPlan,
                  points: CompiledPoints) -> Candidate:
    """The chain of our own kernels `kernel` fuses (KernelDef.unfused), one launch a step,
    each step's point as the plan serves its problem: the launches users would run without
    the fused kernel."""
    name = f"{UNFUSED_NAME}: {' + '.join(step.kernel for step in kernel.unfused)}"
    steps, served = [], []
    for step in kernel.unfused:
        step_kernel = get_kernel(step.kernel)
        try:
            step_problem = step.problem(problem)
        except NotApplicableError as err:
            return Candidate(name, None, f"not run: {err}")
        config = plan.entry_for(step_kernel, step_problem).config
        steps.append((ours_runner(step_kernel, step_problem, config, points), step.names))
        served.append(f"{step.kernel} {config_to_json(config)}")

    def run(tensors: Tensors) -> Mapping[str, torch.Tensor]:
        chain = dict(tensors)
        for runner, names in steps:
            # The chain's tensors under their own names and under the step's names for them
            # (one tensor may be two of the step's: rmsnorm's x and its unused residual).
            written = runner({**chain, **{step_name: chain[chain_name]
                                          for step_name, chain_name in names.items()}})
            chain.update({names.get(name, name): t for name, t in written.items()})
        return {name: chain[name] for name in kernel.outputs}

    return Candidate(name, run, "; ".join(served),
                     roundings=1 + sum(step.rounds for step in kernel.unfused))


def candidates(kernel: KernelDef, problem: Problem, plan: ServingPlan,
               points: CompiledPoints) -> list[Candidate]:
    """Ours as `plan` serves the problem (and the heuristic default), each made ready by
    `points`, then torch and the kernel's peers."""
    entry = plan.entry_for(kernel, problem)
    if entry.source == DEFAULT:
        tuned = Candidate(TUNED_NAME, None, f"no winner stored for bucket "
                          f"{bucket_of(problem.num_tokens)} on this device (cutetune tune first)")
    else:
        origin = {NEAREST: f" (winner of bucket {entry.tuned_bucket})",
                  BORROWED: f" (winner of {entry.lender.describe()} at this bucket)"
                  if entry.lender else "",
                  SHIPPED: " (shipped with cutetune)"}.get(entry.source, "")
        tuned = Candidate(TUNED_NAME, ours_runner(kernel, problem, entry.config, points),
                          config_to_json(entry.config) + origin)
    default = kernel.default_config(problem, plan.spec)
    eager = torch_eager(kernel, problem)
    found = [
        tuned,
        Candidate(DEFAULT_NAME, ours_runner(kernel, problem, default, points),
                  config_to_json(default)),
        Candidate("torch eager", eager, ""),
        Candidate("torch.compile", torch.compile(eager, dynamic=False), ""),
    ]
    if kernel.unfused:
        found.append(unfused_chain(kernel, problem, plan, points))
    for peer in kernel.peers:
        try:
            found.append(Candidate(peer.name, peer.build(problem), ""))
        except PeerUnavailable as err:
            found.append(Candidate(peer.name, None, f"not run: {err}"))
    return found


def bench_problem(kernel: KernelDef, problem: Problem, found: Sequence[Candidate],
                  spec: DeviceSpec, copy_gbps: float,
                  on_candidate: Callable[[str], None] = lambda message: None) -> list[BenchRow]:
    """Check every candidate, then time those that agree with the reference on the same input
    sets, in interleaved rounds (time_interleaved). on_candidate hears which one is checked:
    a first call may compile or autotune for minutes (torch.compile; liger's Triton kernels
    autotune over tens of configs per shape)."""
    bytes_moved = kernel.cost(problem, kernel.default_config(problem, spec), spec).bytes_moved
    make_inputs = kernel.bench_inputs or kernel.make_inputs
    device = torch.device("cuda", torch.cuda.current_device())

    def check_inputs() -> Tensors:
        # The same values each time, fresh: candidates may write in place.
        return make_inputs(problem, device, torch.Generator(device=device).manual_seed(0))

    generator = torch.Generator(device=device).manual_seed(1)
    sets = [make_inputs(problem, device, generator)
            for _ in range(input_sets_for(bytes_moved, spec.l2_bytes))]
    expected = kernel.reference(check_inputs(), problem)
    rows: list[BenchRow | None] = []
    to_time: list[tuple[int, Candidate]] = []  # (row, candidate) of those that agreed
    for candidate in found:
        if candidate.run is None:
            rows.append(BenchRow(problem, candidate.name, None, None, None, None, candidate.note))
            continue
        on_candidate(f"  tokens={problem.num_tokens}: checking {candidate.name} ...")
        buffers = check_inputs()
        outputs = candidate.run(buffers)
        torch.cuda.synchronize()
        try:
            check_outputs(kernel, problem, outputs, expected, label=f"{candidate.name}: ",
                          roundings=candidate.roundings)
        except VerificationError as err:
            if candidate.name in OURS or candidate.name.startswith(UNFUSED_NAME):
                raise BenchError(f"{problem.describe()}: {err}") from err
            rows.append(BenchRow(problem, candidate.name, None, None, None, None,
                                 f"not timed, disagrees with the reference: {err}"))
            continue
        to_time.append((len(rows), candidate))
        rows.append(None)
    on_candidate(f"  tokens={problem.num_tokens}: timing {len(to_time)} candidates in "
                 f"{INTERLEAVED_ROUNDS} interleaved rounds ...")
    timings = time_candidates([[lambda t=t, run=candidate.run: run(t) for t in sets]
                               for _, candidate in to_time])
    for (row, candidate), (timed, note) in zip(to_time, timings, strict=True):
        note = "; ".join(n for n in (candidate.note, note) if n)
        rows[row] = (BenchRow(problem, candidate.name, None, None, None, None, note)
                     if timed is None else
                     _timed_row(problem, candidate.name, timed, bytes_moved, copy_gbps, note))
    rows.append(_timed_row(problem, COPY_NAME, time_copy_of(bytes_moved, spec.l2_bytes),
                           bytes_moved, copy_gbps, "half read, half written: the size-matched "
                           "ceiling"))
    return rows


APART = "timed apart: the candidates' CUDA graphs together exceed the GPU's memory"
ALONE_TOO_LARGE = "not timed: its CUDA graph alone exceeds the GPU's memory"


def time_candidates(launch_sets: Sequence[Sequence[Callable[[], None]]]
                    ) -> list[tuple[Measurement | None, str]]:
    """Each candidate's time and a note: interleaved (time_interleaved) where every
    candidate's graph fits the GPU's memory at once, else one candidate at a time, each graph
    freed before the next is captured (the note says so), and a candidate whose graph alone
    does not fit is not timed. At the largest sizes the graphs hold every call's fresh outputs
    (an unfused MoE chain's buffers of 266k rows), which together pass 80 GB."""
    try:
        return [(timed, "") for timed in time_interleaved(launch_sets)]
    except torch.OutOfMemoryError:
        pass  # outside the handler, so the traceback's frames free the captured graphs
    torch.cuda.empty_cache()
    timings = []
    for launches in launch_sets:
        try:
            timings.append((time_in_graph(launches), APART))
        except torch.OutOfMemoryError:
            timings.append((None, ALONE_TOO_LARGE))
        torch.cuda.empty_cache()
    return timings


def _timed_row(problem: Problem, name: str, timed: Measurement, bytes_moved: int,
               copy_gbps: float, note: str) -> BenchRow:
    gbps = bytes_moved / (timed.median_us * 1e-6) / 1e9
    return BenchRow(problem, name, timed.median_us, timed.iqr_us, gbps, 100 * gbps / copy_gbps,
                    note)


def speedup_over_best_peer(rows: Sequence[BenchRow]) -> float | None:
    """Best peer's time over ours (tuned where there is a winner, else the default)."""
    timed = {r.implementation: r.median_us for r in rows if r.median_us is not None}
    peers = [us for name, us in timed.items() if name not in (*OURS, COPY_NAME)]
    ours = timed.get(TUNED_NAME, timed.get(DEFAULT_NAME))
    if not peers or ours is None:
        return None
    return min(peers) / ours


def run_bench(kernel: KernelDef, problems: Iterable[Problem], tokens: Sequence[int],
              db: Database, on_problem: Callable[[list[BenchRow]], None],
              on_candidate: Callable[[str], None] = lambda message: None,
              cache_dir: Path | None = None) -> BenchRun:
    """Bench every static problem at every token count; store the timed rows, all or none.
    on_problem receives each problem's rows, on_candidate bench_problem's progress lines;
    our points are loaded from (and stored to) the artifact cache under `cache_dir`."""
    # torch.compile specialises on every shape benchmarked; let it keep them all.
    torch._dynamo.config.recompile_limit = 256
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    copy_gbps = measure_copy_gbps()
    empty_us = measure_launch_floor_us()
    record_ceilings(db, fingerprint, {"copy_gbps": copy_gbps, "launch_floor_us": empty_us})
    store = artifact_store(cache_dir, fingerprint) if cache_dir is not None else None
    served = (kernel.name, *(step.kernel for step in kernel.unfused))
    plan = ServingPlan(spec, [w for name in dict.fromkeys(served)
                              for w in winners_to_serve(db, fingerprint, name)],
                       shipped_winners(fingerprint), on_rejected=say_skipped)
    points = CompiledPoints(compile_here if store is None else store.get)
    rows: list[BenchRow] = []
    for static in problems:
        for n in tokens:
            problem = static.with_tokens(n)
            problem_rows = bench_problem(kernel, problem, candidates(kernel, problem, plan, points),
                                         spec, copy_gbps, on_candidate)
            on_problem(problem_rows)
            rows += problem_rows
    record_bench(db, fingerprint, [
        BenchRecord(kernel.name, r.problem.static_key(), r.problem.num_tokens, r.implementation,
                    r.median_us, r.gbps, r.pct_of_copy)
        for r in rows if r.median_us is not None])
    return BenchRun(fingerprint.gpu_name, copy_gbps, empty_us, tuple(rows))


def csv_rows(kernel: KernelDef, run: BenchRun) -> list[dict[str, Any]]:
    out = []
    for r in run.rows:
        out.append({"gpu": run.gpu_name, "kernel": kernel.name,
                    "problem": r.problem.static_key(), "tokens": r.problem.num_tokens,
                    "implementation": r.implementation, "us": r.median_us, "iqr_us": r.iqr_us,
                    "gbps": r.gbps, "pct_of_copy": r.pct_of_copy, "copy_gbps": run.copy_gbps,
                    "empty_kernel_us": run.empty_kernel_us, "note": r.note})
    return out
