"""The embedding lookup fused with RMSNorm: kernel, launcher and compile, as
cutetune.kernels.embedding_rmsnorm declares them. The id lookup and the gather are embedding's
device helpers, the reduction rmsnorm's building blocks."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import blocks as device_blocks
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.device.embedding import ID_TYPES, gather_vector, id_lookup
from cutetune.kernels.embedding_rmsnorm import (
    EmbeddingRMSNormConfig,
    EmbeddingRMSNormProblem,
    _norm_config,
)
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW
from cutetune.kernels.rmsnorm import _vector_elements as _norm_vector_elements


@cute.jit
def _embed_and_normalise(mIds: cute.Tensor, mE: cute.Tensor, mW: cute.Tensor,
                         mR: cute.Tensor, mO: cute.Tensor, mError: cute.Tensor, row, lane, warp,
                         VEC: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                         WARPS: cutlass.Constexpr[int], VOCAB: cutlass.Constexpr[int],
                         SCALE: cutlass.Constexpr[float], EPS: cutlass.Constexpr[float],
                         WEIGHT_BIAS: cutlass.Constexpr[float], HINTS: cutlass.Constexpr[str]):
    """Token `row`'s table row gathered into residual and normalised into out by its THREADS
    threads (`lane` in [0, THREADS)), as rmsnorm's _normalise_row normalises a row of x. WARPS
    > 1: the row's threads span WARPS warps (`warp` is this thread's) and meet at one block
    barrier, so every thread of the block must call this."""
    hidden = cute.size(mW)
    vectors = hidden // VEC
    vectors_per_thread = (vectors + THREADS - 1) // THREADS
    ragged = vectors % THREADS != 0
    # The id's load first: the gather waits for it, the weight's loads do not.
    local, held, bad = id_lookup(mIds[row], cute.size(mE, mode=[0]), 0, VOCAB, VOCAB)
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
            # Clamped to the row's last vector, so every address stays inside the row.
            slot = cutlass.min(slot, vectors - 1)
        slots.append(slot)
        tWrW.append(device_blocks.preload_fp32(tWgW, slot))
    tXrX = [gather_vector(mE, local, held, slot, VEC, HINTS).load() for slot in slots]
    for v in cutlass.range_constexpr(vectors_per_thread):
        if cutlass.const_expr(SCALE != 1.0):
            # Gemma's normaliser, applied in the table's dtype: the residual holds the rounded
            # product and the norm reads it.
            tXrX[v] = (tXrX[v].to(Float32) * SCALE).to(mR.element_type)
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
    # One thread per bad token raises the flag; racing stores all write 1, and no thread
    # clears it (the caller does).
    if lane == 0 and bad:
        mError[0] = Int32(1)


@cute.kernel
def _embedding_rmsnorm_kernel(mIds: cute.Tensor, mE: cute.Tensor, mW: cute.Tensor,
                              mR: cute.Tensor, mO: cute.Tensor, mError: cute.Tensor,
                              VEC: cutlass.Constexpr[int], BLOCK_ROWS: cutlass.Constexpr[bool],
                              WARPS: cutlass.Constexpr[int], VOCAB: cutlass.Constexpr[int],
                              SCALE: cutlass.Constexpr[float], EPS: cutlass.Constexpr[float],
                              WEIGHT_BIAS: cutlass.Constexpr[float],
                              HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // WARP
    if cutlass.const_expr(BLOCK_ROWS):
        # The grid has exactly one block per token: no tail to guard.
        _embed_and_normalise(mIds, mE, mW, mR, mO, mError, bidx, tidx, warp, VEC, WARPS * WARP,
                             WARPS, VOCAB, SCALE, EPS, WEIGHT_BIAS, HINTS)
    else:
        row = bidx * WARPS + warp
        # Whole warps drop out of the last block: the shuffles stay warp-uniform.
        if row < cute.size(mR, mode=[0]):
            _embed_and_normalise(mIds, mE, mW, mR, mO, mError, row, tidx % WARP, warp, VEC,
                                 WARP, 1, VOCAB, SCALE, EPS, WEIGHT_BIAS, HINTS)


@cute.jit
def _embedding_rmsnorm_launch(mIds: cute.Tensor, mE: cute.Tensor, mW: cute.Tensor,
                              mR: cute.Tensor, mO: cute.Tensor, mError: cute.Tensor,
                              stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                              BLOCK_ROWS: cutlass.Constexpr[bool], WARPS: cutlass.Constexpr[int],
                              VOCAB: cutlass.Constexpr[int], SCALE: cutlass.Constexpr[float],
                              EPS: cutlass.Constexpr[float],
                              WEIGHT_BIAS: cutlass.Constexpr[float],
                              HINTS: cutlass.Constexpr[str]):
    rows = cute.size(mR, mode=[0])
    rows_per_block = 1 if BLOCK_ROWS else WARPS
    blocks = (rows + rows_per_block - 1) // rows_per_block
    _embedding_rmsnorm_kernel(mIds, mE, mW, mR, mO, mError, VEC, BLOCK_ROWS, WARPS, VOCAB, SCALE,
                              EPS, WEIGHT_BIAS, HINTS).launch(
        grid=(blocks, 1, 1), block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: EmbeddingRMSNormProblem, config: EmbeddingRMSNormConfig,
                   options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the table's rows and the row strides are symbolic, so the result serves
    every call (and make_inputs' tables of fewer rows than the vocabulary)."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _norm_vector_elements(problem.norm, _norm_config(config))
    tokens = cute.sym_int()
    id_type = ID_TYPES[problem.ids_dtype]
    ids = fake_compact(id_type, (tokens,), assumed_align=id_type.width // 8)
    # Every tensor starts 16-byte aligned (the op checks it, as embedding's does).
    table = fake_rows(dtype, cute.sym_int(), (problem.hidden,), vec, assumed_align=16)
    weight = fake_compact(dtype, (problem.hidden,), assumed_align=16)
    residual = fake_rows(dtype, tokens, (problem.hidden,), vec, assumed_align=16)
    out = fake_rows(dtype, tokens, (problem.hidden,), vec, assumed_align=16)
    error = fake_compact(cutlass.Int32, (1,), assumed_align=4)
    return compile_launcher(
        _embedding_rmsnorm_launch, (ids, table, weight, residual, out, error),
        (vec, config.form == BLOCK_PER_ROW, config.warps_per_block, problem.vocab_size,
         float(problem.embed_scale), float(problem.eps), float(problem.weight_bias),
         config.cache_hints),
        options)
