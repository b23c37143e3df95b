"""RMSNorm's kernel, launcher and compile, as cutetune.kernels.rmsnorm declares them."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import blocks as device_blocks
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.dtypes import DTYPE_BYTES
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, RMSNormConfig, RMSNormProblem, _vector_elements


@cute.jit
def _normalise_row(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                   row, lane, warp, VEC: cutlass.Constexpr[int],
                   THREADS: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                   FUSED_ADD: cutlass.Constexpr[bool], EPS: cutlass.Constexpr[float],
                   WEIGHT_BIAS: cutlass.Constexpr[float], HINTS: cutlass.Constexpr[str]):
    """Normalise row `row` by its THREADS threads (`lane` in [0, THREADS)). WARPS > 1: the
    row's threads span WARPS warps (`warp` is this thread's) and meet at one block barrier,
    so every thread of the block must call this. HINTS apply to x, residual and out; the
    weight, which every row reads again, keeps plain loads."""
    hidden = cute.size(mW)
    vectors = hidden // VEC
    vectors_per_thread = (vectors + THREADS - 1) // THREADS
    ragged = vectors % THREADS != 0
    tXgX = cute.zipped_divide(mX[row, None], (VEC,))
    tRgR = cute.zipped_divide(mR[row, None], (VEC,))
    tOgO = cute.zipped_divide(mO[row, None], (VEC,))
    tWgW = cute.zipped_divide(mW, (VEC,))
    last_slot = (vectors_per_thread - 1) * THREADS + lane
    last_valid = last_slot < vectors
    slots = []
    tWrW = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        slot = v * THREADS + lane
        if cutlass.const_expr(ragged and v == vectors_per_thread - 1):
            slot = cutlass.min(slot, vectors - 1)
        slots.append(slot)
        tWrW.append(device_blocks.preload_fp32(tWgW, slot))
    tXrX = [cache_hints.load(tXgX[(None, slot)], HINTS) for slot in slots]
    if cutlass.const_expr(FUSED_ADD):
        # Every load is issued before the first residual store: the compiler may not move a
        # load above a store that could alias it, so interleaving them would cost a memory
        # round trip per vector.
        tRrR = [cache_hints.load(tRgR[(None, slot)], HINTS) for slot in slots]
        for v in cutlass.range_constexpr(vectors_per_thread):
            # vLLM's contract: the sum is rounded to the input dtype, stored, and normalised.
            tXrX[v] = (tXrX[v].to(Float32) + tRrR[v].to(Float32)).to(mX.element_type)
            if cutlass.const_expr(ragged and v == vectors_per_thread - 1):
                if last_valid:
                    cache_hints.store(tRgR[(None, slots[v])], tXrX[v], HINTS)
            else:
                cache_hints.store(tRgR[(None, slots[v])], tXrX[v], HINTS)
    square_sum = device_blocks.tied_zero(tWrW)
    for v in cutlass.range_constexpr(vectors_per_thread):
        tXrX[v] = tXrX[v].to(Float32)
        square = device_blocks.sum_of_squares(tXrX[v])
        if cutlass.const_expr(ragged and v == vectors_per_thread - 1):
            # The clamped slot repeats the row's last vector: count it once.
            if last_valid:
                square_sum = square_sum + square
        else:
            square_sum = square_sum + square
    square_sum = device_blocks.butterfly_sum(square_sum, WARP)
    if cutlass.const_expr(WARPS > 1):
        square_sum = device_blocks.sum_across_warps(square_sum, warp, lane % WARP, WARPS)
    inv_rms = device_blocks.inverse_rms(square_sum, hidden, EPS)
    for v in cutlass.range_constexpr(vectors_per_thread):
        y = device_blocks.rms_normalised(tXrX[v], inv_rms, tWrW[v], WEIGHT_BIAS).to(
            mO.element_type)
        if cutlass.const_expr(ragged and v == vectors_per_thread - 1):
            if last_valid:
                cache_hints.store(tOgO[(None, slots[v])], y, HINTS)
        else:
            cache_hints.store(tOgO[(None, slots[v])], y, HINTS)


@cute.kernel
def _rmsnorm_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                    VEC: cutlass.Constexpr[int], BLOCK_ROWS: cutlass.Constexpr[bool],
                    WARPS: cutlass.Constexpr[int], FUSED_ADD: cutlass.Constexpr[bool],
                    EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                    HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // WARP
    if cutlass.const_expr(BLOCK_ROWS):
        # The grid has exactly one block per row: no tail to guard.
        _normalise_row(mX, mR, mW, mO, bidx, tidx, warp, VEC, WARPS * WARP, WARPS, FUSED_ADD,
                       EPS, WEIGHT_BIAS, HINTS)
    else:
        row = bidx * WARPS + warp
        # Whole warps drop out of the last block: the shuffles stay warp-uniform.
        if row < cute.size(mX, mode=[0]):
            _normalise_row(mX, mR, mW, mO, row, tidx % WARP, warp, VEC, WARP, 1, FUSED_ADD,
                           EPS, WEIGHT_BIAS, HINTS)


@cute.jit
def _rmsnorm_launch(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                    stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                    BLOCK_ROWS: cutlass.Constexpr[bool], WARPS: cutlass.Constexpr[int],
                    FUSED_ADD: cutlass.Constexpr[bool], EPS: cutlass.Constexpr[float],
                    WEIGHT_BIAS: cutlass.Constexpr[float], HINTS: cutlass.Constexpr[str]):
    """mR is the residual (updated in place) when FUSED_ADD, else unused: the plain form
    takes any tensor of x's shape there (the op passes x) so both forms share one call
    signature."""
    rows = cute.size(mX, mode=[0])
    rows_per_block = 1 if BLOCK_ROWS else WARPS
    blocks = (rows + rows_per_block - 1) // rows_per_block
    _rmsnorm_kernel(mX, mR, mW, mO, VEC, BLOCK_ROWS, WARPS, FUSED_ADD, EPS, WEIGHT_BIAS,
                    HINTS).launch(grid=(blocks, 1, 1), block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: RMSNormProblem, config: RMSNormConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the row
    count and the row strides are symbolic, so the result serves every call."""
    vec = _vector_elements(problem, config)
    rows = cute.sym_int()

    def vector_bytes(dtype_name: str) -> int:
        # Each tensor's start is aligned to one vector of its own dtype.
        return vec * DTYPE_BYTES[dtype_name]

    def rows_tensor(dtype_name: str):
        return fake_rows(CUTLASS_DTYPES[dtype_name], rows, (problem.hidden,), vec,
                         vector_bytes(dtype_name))

    weight = fake_compact(CUTLASS_DTYPES[problem.dtype], (problem.hidden,),
                          vector_bytes(problem.dtype))
    return compile_launcher(
        _rmsnorm_launch,
        (rows_tensor(problem.dtype), rows_tensor(problem.dtype), weight,
         rows_tensor(problem.out_dtype)),
        (vec, config.form == BLOCK_PER_ROW, config.warps_per_block, problem.fused_add,
         float(problem.eps), float(problem.weight_bias), config.cache_hints),
        options)
