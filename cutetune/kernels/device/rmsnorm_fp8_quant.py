"""rmsnorm_fp8_quant's kernel, launcher and compile, as cutetune.kernels.rmsnorm_fp8_quant
declares them: rmsnorm's row (device/blocks.py's weight preload, tie, reductions and RMS scale)
whose normalised vectors, rounded to x's dtype, each group's lanes quantise (device/fp8_quant.py)
instead of storing."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import blocks as device_blocks
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device import fp8_quant as quant
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, RMSNormConfig
from cutetune.kernels.rmsnorm_fp8_quant import RMSNormFP8QuantProblem, _vector_elements


@cute.jit
def _quantize_row(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mQ: cute.Tensor,
                  mS: cute.Tensor, row, lane, warp, VEC: cutlass.Constexpr[int],
                  THREADS: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                  GROUP: cutlass.Constexpr[int], FUSED_ADD: cutlass.Constexpr[bool],
                  EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                  UE8M0: cutlass.Constexpr[bool], COLUMN_MAJOR: cutlass.Constexpr[bool],
                  HINTS: cutlass.Constexpr[str]):
    """Normalise and quantise row `row` by its THREADS threads (`lane` in [0, THREADS)); WARPS
    > 1: the row's threads span WARPS warps and meet at one block barrier, so every thread of
    the block must call this. A ragged last slot is clamped onto the row's last vector: its
    group (all of whose lanes are past the row, since THREADS and the row's vectors are
    multiples of the group's) takes part in the shuffles and stores nothing."""
    hidden = cute.size(mW)
    vectors = hidden // VEC
    vectors_per_thread = (vectors + THREADS - 1) // THREADS
    ragged = vectors % THREADS != 0
    group_lanes = GROUP // VEC
    tXgX = cute.zipped_divide(mX[row, None], (VEC,))
    tRgR = cute.zipped_divide(mR[row, None], (VEC,))
    tQgQ = cute.zipped_divide(mQ[row, None], (VEC,))
    tWgW = cute.zipped_divide(mW, (VEC,))
    last_valid = (vectors_per_thread - 1) * THREADS + lane < vectors
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
        # Every load before the first residual store, as rmsnorm issues them.
        tRrR = [cache_hints.load(tRgR[(None, slot)], HINTS) for slot in slots]
        for v in cutlass.range_constexpr(vectors_per_thread):
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
            if last_valid:
                square_sum = square_sum + square
        else:
            square_sum = square_sum + square
    square_sum = device_blocks.butterfly_sum(square_sum, WARP)
    if cutlass.const_expr(WARPS > 1):
        square_sum = device_blocks.sum_across_warps(square_sum, warp, lane % WARP, WARPS)
    inv_rms = device_blocks.inverse_rms(square_sum, hidden, EPS)
    for v in cutlass.range_constexpr(vectors_per_thread):
        # What rmsnorm writes in x's dtype, read back as fp8_group_quant reads it.
        y = device_blocks.rms_normalised(tXrX[v], inv_rms, tWrW[v], WEIGHT_BIAS).to(
            mX.element_type).to(Float32)
        scale = quant.group_scale(quant.lanes_max(quant.absmax([y]), group_lanes), UE8M0)
        q = quant.quantized(y, scale)
        if cutlass.const_expr(ragged and v == vectors_per_thread - 1):
            if last_valid:
                cache_hints.store(tQgQ[(None, slots[v])], q, HINTS)
                if lane % group_lanes == 0:
                    quant.store_scale(mS, row, slots[v] // group_lanes, scale, COLUMN_MAJOR)
        else:
            cache_hints.store(tQgQ[(None, slots[v])], q, HINTS)
            if lane % group_lanes == 0:
                quant.store_scale(mS, row, slots[v] // group_lanes, scale, COLUMN_MAJOR)


@cute.kernel
def _rmsnorm_fp8_quant_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor,
                              mQ: cute.Tensor, mS: cute.Tensor, VEC: cutlass.Constexpr[int],
                              BLOCK_ROWS: cutlass.Constexpr[bool], WARPS: cutlass.Constexpr[int],
                              GROUP: cutlass.Constexpr[int], FUSED_ADD: cutlass.Constexpr[bool],
                              EPS: cutlass.Constexpr[float],
                              WEIGHT_BIAS: cutlass.Constexpr[float],
                              UE8M0: cutlass.Constexpr[bool],
                              COLUMN_MAJOR: cutlass.Constexpr[bool],
                              HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // WARP
    if cutlass.const_expr(BLOCK_ROWS):
        _quantize_row(mX, mR, mW, mQ, mS, bidx, tidx, warp, VEC, WARPS * WARP, WARPS, GROUP,
                      FUSED_ADD, EPS, WEIGHT_BIAS, UE8M0, COLUMN_MAJOR, HINTS)
    else:
        row = bidx * WARPS + warp
        # Whole warps drop out of the last block: the shuffles stay warp-uniform.
        if row < cute.size(mX, mode=[0]):
            _quantize_row(mX, mR, mW, mQ, mS, row, tidx % WARP, warp, VEC, WARP, 1, GROUP,
                          FUSED_ADD, EPS, WEIGHT_BIAS, UE8M0, COLUMN_MAJOR, HINTS)


@cute.jit
def _rmsnorm_fp8_quant_launch(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor,
                              mQ: cute.Tensor, mS: cute.Tensor, stream: cuda.CUstream,
                              VEC: cutlass.Constexpr[int], BLOCK_ROWS: cutlass.Constexpr[bool],
                              WARPS: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                              FUSED_ADD: cutlass.Constexpr[bool], EPS: cutlass.Constexpr[float],
                              WEIGHT_BIAS: cutlass.Constexpr[float],
                              UE8M0: cutlass.Constexpr[bool],
                              COLUMN_MAJOR: cutlass.Constexpr[bool],
                              HINTS: cutlass.Constexpr[str]):
    """mR is the residual (updated in place) when FUSED_ADD, else unused (the op passes x)."""
    rows = cute.size(mX, mode=[0])
    rows_per_block = 1 if BLOCK_ROWS else WARPS
    blocks = (rows + rows_per_block - 1) // rows_per_block
    _rmsnorm_fp8_quant_kernel(mX, mR, mW, mQ, mS, VEC, BLOCK_ROWS, WARPS, GROUP, FUSED_ADD, EPS,
                              WEIGHT_BIAS, UE8M0, COLUMN_MAJOR, HINTS).launch(
        grid=(blocks, 1, 1), block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: RMSNormFP8QuantProblem, config: RMSNormConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the row
    count, the row strides and the scales' stride are symbolic, so the result serves every
    call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    rows = cute.sym_int()

    def rows_tensor(element_type):
        return fake_rows(element_type, rows, (problem.hidden,), vec, assumed_align=16)

    return compile_launcher(
        _rmsnorm_fp8_quant_launch,
        (rows_tensor(dtype), rows_tensor(dtype),
         fake_compact(dtype, (problem.hidden,), assumed_align=16), rows_tensor(quant.FP8),
         quant.fake_scales(rows, problem.hidden // problem.group_size,
                           problem.column_major_scales)),
        (vec, config.form == BLOCK_PER_ROW, config.warps_per_block, problem.group_size,
         problem.fused_add, float(problem.eps), float(problem.weight_bias), problem.ue8m0,
         problem.column_major_scales, config.cache_hints),
        options)
