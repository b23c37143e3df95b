"""Would routing inside the copy kernel hide it? A one-kernel variant of split dispatch, timed
against split at a prefill size (BENCHMARKS.md, Mixtral at 4096 tokens).

The variant launches split's copy grid (one unit per block) as one ordinary kernel. Every
block first loads its unit's x vectors; blocks 0 .. R-1 then also run split's routing
(`moe_dispatch._route_chunks`, with its grid barrier among the R) and raise a done count with
a release add. Every block's thread 0 spins on that count with acquire loads until all R have
finished, the block stores its vectors to their rows, and the last block past the count (a
second counter) sets both back to zero for the next call. So there is no second launch and no
programmatic-dependent-launch wait, and the first blocks load x while routing runs.

It relies on the GPU starting blocks 0 .. R-1 no later than any block that spins (blocks start
in index order on current NVIDIA GPUs, which CUDA does not promise): a probe, not a form of the
op. Each variant is checked against the reference (three calls per input set, so the reset is
exercised), then all are timed as `cutetune bench` times (CUDA graphs over rotated input sets,
interleaved rounds), twice, beside split's points and a copy of the same bytes.

    python3 benchmarks/moe_dispatch_inline_probe.py mixtral-8x7b 4096 [--compile-only]
"""

from __future__ import annotations

import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32
from moe_dispatch_parts import cold_input_sets, op_args

from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.dtypes import vector_elements
from cutetune.kernels.moe_common import check_dispatch
from cutetune.spaces.models import PRESETS

# Words of the probe's own sync tensor, on separate 128-byte lines.
SYNC_DONE, SYNC_PASSED, SYNC_WORDS = 0, 32, 64
# (routing blocks R, warps per block, tokens per block) of the one-kernel variant.
VARIANTS = [(routers, warps, tpb) for routers in (128, 32, 8)
            for warps, tpb in ((8, 1), (8, 2), (4, 2))]
SPLITS = [md.MoEDispatchConfig(md.SPLIT, 128, 8, 128, 1),
          md.MoEDispatchConfig(md.SPLIT, 128, 4, 128, 2),
          md.MoEDispatchConfig(md.SPLIT, 32, 8, 128, 2)]


@cute.kernel
def _inline_kernel(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                   mCounts: cute.Tensor, mOffsets: cute.Tensor, mError: cute.Tensor,
                   mWs: cute.Tensor, mSync: cute.Tensor, K: cutlass.Constexpr[int],
                   E: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                   PAD: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                   V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                   TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                   ROUTERS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    tokens = cute.size(mX, mode=[0])
    group, column = md._unit_position(bidx, tidx, SLICES, THREADS)
    # A column past the row (a ragged last slice) loads the row's last vector and stores none.
    values = md._unit_loads(gX, tokens, group, cutlass.min(column, V - 1), VEC, TPB)
    if bidx < ROUTERS:
        md._route_chunks(mIds, mRowOf, mCounts, mOffsets, mError, mWs, tidx, bidx, K, E, 0, L,
                         PAD, False, THREADS, ROUTERS)
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.atomic_add(mSync.iterator + SYNC_DONE, Int32(1), sem="release",
                                 scope="gpu")
    passed = Int32(0)
    if tidx == 0:
        seen = cute.arch.load(mSync.iterator + SYNC_DONE, Int32, sem="acquire", scope="gpu")
        while seen < ROUTERS:
            seen = cute.arch.load(mSync.iterator + SYNC_DONE, Int32, sem="acquire",
                                  scope="gpu")
        passed = cute.arch.atomic_add(mSync.iterator + SYNC_PASSED, Int32(1), sem="relaxed",
                                      scope="gpu")
    cute.arch.sync_threads()
    if column < V:
        md._unit_stores(gDisp, values, md._StoredRows(mRowOf), tokens, group, column, K, TPB)
    if tidx == 0:
        # Every block has seen the done count: the next call starts from zero.
        if passed == gdim - 1:
            mSync[SYNC_DONE] = Int32(0)
            mSync[SYNC_PASSED] = Int32(0)


@cute.jit
def _inline_launch(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, mSync,
                   stream: cuda.CUstream, K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                   L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                   VEC: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                   TPB: cutlass.Constexpr[int], ROUTERS: cutlass.Constexpr[int]):
    V = cute.size(mX, mode=[1]) // VEC
    SLICES = (V + THREADS - 1) // THREADS
    units = md._copy_unit_total(cute.size(mX, mode=[0]), TPB, SLICES)
    _inline_kernel(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, mSync, K, E, L, PAD,
                   VEC, V, THREADS, TPB, SLICES, ROUTERS).launch(
        grid=(units, 1, 1), block=(THREADS, 1, 1), stream=stream)


def compile_inline(problem: md.MoEProblem, routers: int, warps: int, tokens_per_block: int):
    vec = vector_elements(problem.dtype, 128)
    fake = md.FakeArguments(problem, vec)
    return cute.compile(_inline_launch, *fake.op_tensors(), fake.ints(SYNC_WORDS),
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                        problem.top_k, problem.experts, problem.local_experts, problem.pad, vec,
                        warps * md.WARP, tokens_per_block, routers, options="--enable-tvm-ffi")


def main() -> None:
    model, tokens = sys.argv[1], int(sys.argv[2])
    (static,) = md.KERNEL.problems_for_model(PRESETS[model], "bfloat16")
    problem = static.with_tokens(tokens)
    if tokens * md._slices(problem, SPLITS[0]) < max(r for r, _, _ in VARIANTS):
        raise SystemExit(f"{tokens} tokens give fewer copy blocks than routing blocks")
    inline = {v: compile_inline(problem, *v) for v in VARIANTS}
    splits = {c: md.KERNEL.compile(problem, c) for c in SPLITS}
    if "--compile-only" in sys.argv:
        print("compiled", len(inline) + len(splits))
        return
    from cutetune.tuner.ceilings import measure_copy_gbps, time_copy_of
    from cutetune.tuner.measure import time_interleaved

    spec, nbytes, sets = cold_input_sets(problem, SPLITS[0])
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device="cuda")

    def args(t):
        return (*op_args(t), sync)

    for fn in inline.values():
        for t in sets:
            for _ in range(3):
                fn(*args(t))
            torch.cuda.synchronize()
            check_dispatch({name: t[name] for name in md.KERNEL.outputs},
                           md.reference(t, problem), problem)
        if int(sync.count_nonzero()):
            raise SystemExit(f"the sync words were not reset: {sync.tolist()}")
    print(f"{len(inline)} one-kernel variants agree with the reference", flush=True)
    ceiling = measure_copy_gbps()
    copy_us = time_copy_of(nbytes, spec.l2_bytes).median_us
    names = [f"split {c.grid_blocks}x{c.warps_per_block}w t{c.tokens_per_block}" for c in splits]
    launch_sets = [[lambda t=t, fn=fn: md.launch(fn, t) for t in sets] for fn in splits.values()]
    names += [f"one kernel, R {r}, {w}w t{tpb}" for r, w, tpb in inline]
    launch_sets += [[lambda t=t, fn=fn: fn(*args(t)) for t in sets] for fn in inline.values()]
    for _ in range(2):
        print(f"{model}, {tokens} tokens, {nbytes / 1e6:.1f} MB, copy ceiling {ceiling:.0f} GB/s, "
              f"a copy of the same bytes {copy_us:.2f} us (85% of the ceiling: "
              f"{nbytes / (0.85 * ceiling * 1e3):.2f} us)")
        for name, timed in zip(names, time_interleaved(launch_sets), strict=True):
            print(f"  {name:26s} {timed.median_us:8.2f} us  IQR {timed.iqr_us:5.2f}  "
                  f"{nbytes / (timed.median_us * 1e3) / ceiling:6.1%}", flush=True)


if __name__ == "__main__":
    main()
