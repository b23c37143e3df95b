"""A %globaltimer timeline of split dispatch at a prefill size: why 2.3-2.7 us of routing stay
exposed although the copy kernel launches early (BENCHMARKS.md, Mixtral at 4096 tokens).

A one-thread kernel stamps the time, then the routing kernel runs as the op launches it, then a
copy kernel that is split's vector copy with stamps: each block records when it starts, when
its wait for routing releases and when it ends. Captured per input set into one CUDA graph (as
`cutetune bench` times), replayed, and the stamps read back; times in us after the first stamp,
medians over the replays. The same for routing alone (a stamp after it) and for the copy alone
(no wait). %globaltimer may tick coarsely (about 1 us on some GPUs): a line prints the
smallest nonzero step seen.

Then what a routing delay inside one kernel would cost: the copy alone, each block holding its
stores (its x already loaded) until %globaltimer passes a stamp taken just before the kernel
plus D, for D from 0 to 3 us, timed as `cutetune bench` times. If a delay of D costs about D,
routing inside the copy kernel would not hide either; if it costs much less, a one-kernel form
whose blocks route for themselves (no second launch, no grid barrier) could.

    python3 benchmarks/moe_dispatch_timeline.py mixtral-8x7b 4096 [--compile-only]
"""

from __future__ import annotations

import statistics
import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int64
from moe_dispatch_parts import cold_input_sets, op_args

from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.dtypes import vector_elements
from cutetune.spaces.models import PRESETS

WARPS, GRID, TPB = 8, 128, 1  # split 128x8w t1, Mixtral's best split point at 4096 tokens
STAMPS_PER_BLOCK = 3  # start, wait released, end


@cute.kernel
def _stamp_kernel(mT: cute.Tensor, SLOT: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        mT[SLOT] = cute.arch.globaltimer()


@cute.kernel
def _probe_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                       mT: cute.Tensor, K: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                       V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                       SLICES: cutlass.Constexpr[int], AFTER_ROUTING: cutlass.Constexpr[bool],
                       DELAY_NS: cutlass.Constexpr[int]):
    """Split's copy kernel (grid = one unit per block), waiting for routing when AFTER_ROUTING.
    DELAY_NS < 0: block bidx stamps mT[2 + 3 bidx + (0, 1, 2)] at its start, when its wait
    releases and at its end. DELAY_NS >= 0: no stamps; the stores wait until %globaltimer passes
    mT[0] + DELAY_NS, as if routing inside the kernel finished then."""
    stamped = DELAY_NS < 0
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    if cutlass.const_expr(stamped):
        start = cute.arch.globaltimer()
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    tokens = cute.size(mRowOf, mode=[0])
    group, column = md._unit_position(bidx, tidx, SLICES, THREADS)
    if cutlass.const_expr(stamped):
        released = start
    if column < V:
        values = md._unit_loads(gX, tokens, group, column, VEC, TPB)
        if cutlass.const_expr(AFTER_ROUTING):
            cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(stamped):
            released = cute.arch.globaltimer()
        else:
            until = mT[0] + DELAY_NS
            while cute.arch.globaltimer() < until:
                pass
        md._unit_stores(gDisp, values, md._StoredRows(mRowOf), tokens, group, column, K, TPB)
    if cutlass.const_expr(stamped):
        cute.arch.sync_threads()
        if tidx == 0:
            mT[2 + STAMPS_PER_BLOCK * bidx] = start
            mT[2 + STAMPS_PER_BLOCK * bidx + 1] = released
            mT[2 + STAMPS_PER_BLOCK * bidx + 2] = cute.arch.globaltimer()


DELAYS_NS = (0, 500, 1000, 1500, 2000, 3000)
STAMPED = -1  # DELAY_NS of the stamped copy


@cute.jit
def _timeline(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, mT,
              stream: cuda.CUstream, K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
              L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
              VEC: cutlass.Constexpr[int], ROUTE: cutlass.Constexpr[bool],
              COPY: cutlass.Constexpr[bool], DELAY_NS: cutlass.Constexpr[int]):
    """Stamp into mT[0]; then routing (ROUTE) and the copy (COPY; behind routing as a
    programmatic dependent launch when both; stamped, or holding its stores, by DELAY_NS);
    with routing alone, a stamp into mT[1] after it."""
    THREADS = WARPS * 32
    V = cute.size(mX, mode=[1]) // VEC
    SLICES = (V + THREADS - 1) // THREADS
    units = md._copy_unit_total(cute.size(mX, mode=[0]), TPB, SLICES)
    _stamp_kernel(mT, 0).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)
    if cutlass.const_expr(ROUTE):
        md._route_kernel(mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, 0, L, PAD,
                         False, VEC, V, THREADS, SLICES, GRID).launch(
            grid=(GRID, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
    if cutlass.const_expr(COPY):
        _probe_copy_kernel(mX, mRowOf, mDisp, mT, K, VEC, V, THREADS, SLICES, ROUTE,
                           DELAY_NS).launch(grid=(units, 1, 1), block=(THREADS, 1, 1),
                                            stream=stream, use_pdl=ROUTE)
    else:
        _stamp_kernel(mT, 1).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def compile_timelines(problem: md.MoEProblem) -> tuple[dict, dict]:
    """The three timelines by name, and the delayed copies by name."""
    vec = vector_elements(problem.dtype, 128)
    fake = md.FakeArguments(problem, vec)
    L = problem.local_experts
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    timer = cute.runtime.make_fake_tensor(Int64, (cute.sym_int(),), (1,), assumed_align=8)

    def timeline(route: bool, copy: bool, delay_ns: int):
        return cute.compile(_timeline, *fake.op_tensors(), timer, stream, problem.top_k,
                            problem.experts, L, problem.pad, vec, route, copy, delay_ns,
                            options="--enable-tvm-ffi")

    delayed = {f"copy, stores held {d} ns": timeline(False, True, d) for d in DELAYS_NS}
    return {name: timeline(route, copy, STAMPED)
            for name, route, copy in (("op", True, True), ("routing alone", True, False),
                                      ("copy alone", False, True))}, delayed


def _run(compiled, t, stamps: torch.Tensor) -> None:
    """One compiled timeline on input set t, stamping into `stamps`."""
    compiled(*op_args(t), stamps)


def _summary(stamps: torch.Tensor, blocks: int) -> dict[str, float]:
    """One replay's stamps (ns) as us after the first stamp."""
    base = stamps[0]
    if blocks == 0:
        return {"routing done": (stamps[1] - base).item() / 1e3}
    per_block = (stamps[2:2 + STAMPS_PER_BLOCK * blocks].view(blocks, STAMPS_PER_BLOCK)
                 - base).double() / 1e3
    start, released, end = per_block.unbind(1)
    return {"first block start": start.min().item(), "median block start": start.median().item(),
            "last block start": start.max().item(), "first release": released.min().item(),
            "median release": released.median().item(), "last end": end.max().item()}


def main() -> None:
    model, tokens = sys.argv[1], int(sys.argv[2])
    (static,) = md.KERNEL.problems_for_model(PRESETS[model], "bfloat16")
    problem = static.with_tokens(tokens)
    timelines, delayed = compile_timelines(problem)
    if "--compile-only" in sys.argv:
        print("compiled", len(timelines) + len(delayed))
        return
    from cutetune.tuner.measure import time_in_graph

    config = md.MoEDispatchConfig(md.SPLIT, GRID, WARPS, 128, TPB)
    _, _, sets = cold_input_sets(problem, config)
    op = md.KERNEL.compile(problem, config)
    for t in sets:  # row_of for the copy alone
        md.launch(op, t)
    vectors = problem.hidden // vector_elements(problem.dtype, 128)
    units = md._copy_unit_total(tokens, TPB, -(-vectors // (WARPS * 32)))
    stamps = [torch.zeros(2 + STAMPS_PER_BLOCK * units, dtype=torch.int64, device="cuda")
              for _ in sets]
    step = None
    for name, timeline in timelines.items():
        for t, s in zip(sets, stamps, strict=True):
            _run(timeline, t, s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for t, s in zip(sets, stamps, strict=True):
                _run(timeline, t, s)
        samples = []
        for _ in range(20):
            graph.replay()
            torch.cuda.synchronize()
            for s in stamps:
                samples.append(_summary(s, 0 if name == "routing alone" else units))
                deltas = (s[s > 0].sort().values.diff())
                nonzero = deltas[deltas > 0]
                if len(nonzero):
                    step = min(step or 10**12, nonzero.min().item())
        medians = {k: statistics.median(d[k] for d in samples) for k in samples[0]}
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()), flush=True)
    print(f"smallest nonzero %globaltimer step seen: {step} ns")
    op_us = time_in_graph([lambda t=t: md.launch(op, t) for t in sets]).median_us
    print(f"op (split {GRID}x{WARPS}w t{TPB}) {op_us:.2f} us")
    for name, copy in delayed.items():
        held_us = time_in_graph([lambda t=t, s=s, copy=copy: _run(copy, t, s)
                                 for t, s in zip(sets, stamps, strict=True)]).median_us
        print(f"{name} (after a stamp kernel) {held_us:.2f} us", flush=True)


if __name__ == "__main__":
    main()
