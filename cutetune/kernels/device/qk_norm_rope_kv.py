"""qk_norm_rope_kv's kernel, launcher and compile, as cutetune.kernels.qk_norm_rope_kv declares
them: qk_norm_rope's q heads as they are, and its k heads' norm and rotation (its device
functions) followed by their stores into k and, where the token has a slot, into the caches,
with v's head copied beside.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import qk_norm_rope as fused
from cutetune.kernels.device import rope as rope_device
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.qk_norm_rope import (
    CACHE,
    NEOX,
    QKNormRopeConfig,
    _pairs_per_vector,
    _rotated_vectors,
    _threads_per_head,
    _vector_elements,
)
from cutetune.kernels.qk_norm_rope_kv import FP8, QKNormRopeKVProblem

CACHE_DTYPES = {**CUTLASS_DTYPES, FP8: cutlass.Float8E4M3FN}


@cute.jit
def _cached_head(mK: cute.Tensor, mV: cute.Tensor, mKW: cute.Tensor, mPositions: cute.Tensor,
                 mCache: cute.Tensor, mSlots: cute.Tensor, mKeyCache: cute.Tensor,
                 mValueCache: cute.Tensor, mKScale: cute.Tensor, mVScale: cute.Tensor,
                 row: Int32, lane: Int32, VEC: cutlass.Constexpr[int],
                 PAIRS: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                 ROTATED: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                 FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                 LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                 EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                 BLOCK_SIZE: cutlass.Constexpr[int], FP8_CACHE: cutlass.Constexpr[bool]):
    """k's head `row` normalised and rotated in place, then, unless its token's slot is -1,
    stored into key_cache at the slot, and v's head of the same token and index copied into
    value_cache there."""
    heads = cute.size(mK, mode=[1])
    rows = cute.size(mK, mode=[0]) * heads
    safe_row = cutlass.min(row, rows - 1)
    token = safe_row // heads
    head = safe_row % heads
    # The slot, v's head and the scales load before the norm's shuffles (tied to its sum), so
    # that the thread waits for one memory round trip, not three (the slot's, then v's).
    slot = mSlots[token]
    tVgV = cute.zipped_divide(mV[token, head, None], (VEC,))
    values = []
    for v in cutlass.range_constexpr(cute.size(mK, mode=[2]) // (VEC * THREADS_PER_HEAD)):
        values.append(tVgV[(None, v * THREADS_PER_HEAD + lane)].load().to(Float32))
    tied = [(Float32(slot),)] + values
    k_inverse = Float32(1.0)
    v_inverse = Float32(1.0)
    if cutlass.const_expr(FP8_CACHE):
        k_inverse = Float32(1.0) / mKScale[0]
        v_inverse = Float32(1.0) / mVScale[0]
        tied = tied + [(k_inverse,), (v_inverse,)]
    _, y = fused.normed_rotated(mK, mKW, mPositions, mCache, row, lane, VEC, PAIRS,
                                THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE, ROTARY_DIM,
                                LOG2_THETA, SCALING, EPS, WEIGHT_BIAS, tied)
    if row < rows:
        fused.store_row(mK[token, head, None], y, lane, VEC, THREADS_PER_HEAD)
        if slot >= 0:
            block = slot // BLOCK_SIZE
            offset = slot % BLOCK_SIZE
            keys = y
            if cutlass.const_expr(FP8_CACHE):
                # Times the scales' reciprocals (the conversion then rounds and saturates),
                # k from its value in q's dtype, so the cache holds what k holds. One division
                # a thread, not a div.rn.f32 an element, which made the FP8 write several
                # times slower at decode (docs/performance-notes.md); the product is within an
                # ulp of fp32 of the quotient, which moves an FP8 rounding only at a tie.
                keys = []
                for v in cutlass.range_constexpr(len(y)):
                    keys.append(y[v].to(mK.element_type).to(Float32) * k_inverse)
                    values[v] = values[v] * v_inverse
            fused.store_row(mKeyCache[block, offset, head, None], keys, lane, VEC,
                            THREADS_PER_HEAD)
            fused.store_row(mValueCache[block, offset, head, None], values, lane, VEC,
                            THREADS_PER_HEAD)


@cute.kernel
def _qk_norm_rope_kv_kernel(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
                            mV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor,
                            mCache: cute.Tensor, mSlots: cute.Tensor, mKeyCache: cute.Tensor,
                            mValueCache: cute.Tensor, mKScale: cute.Tensor,
                            mVScale: cute.Tensor, q_blocks: Int32, VEC: cutlass.Constexpr[int],
                            PAIRS: cutlass.Constexpr[int],
                            THREADS_PER_HEAD: cutlass.Constexpr[int],
                            HEADS_PER_BLOCK: cutlass.Constexpr[int],
                            ROTATED: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                            FROM_CACHE: cutlass.Constexpr[bool],
                            ROTARY_DIM: cutlass.Constexpr[int],
                            LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                            EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                            BLOCK_SIZE: cutlass.Constexpr[int],
                            FP8_CACHE: cutlass.Constexpr[bool]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % THREADS_PER_HEAD
    in_block = tidx // THREADS_PER_HEAD  # the thread's head among the block's
    if bidx < q_blocks:
        fused.norm_rope_head(mQ, mQW, mPositions, mCache, bidx * HEADS_PER_BLOCK + in_block,
                             lane, VEC, PAIRS, THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE,
                             ROTARY_DIM, LOG2_THETA, SCALING, EPS, WEIGHT_BIAS)
    else:
        _cached_head(mK, mV, mKW, mPositions, mCache, mSlots, mKeyCache, mValueCache, mKScale,
                     mVScale, (bidx - q_blocks) * HEADS_PER_BLOCK + in_block, lane, VEC, PAIRS,
                     THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE, ROTARY_DIM, LOG2_THETA,
                     SCALING, EPS, WEIGHT_BIAS, BLOCK_SIZE, FP8_CACHE)


@cute.jit
def _qk_norm_rope_kv_launch(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
                            mV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor,
                            mCache: cute.Tensor, mSlots: cute.Tensor, mKeyCache: cute.Tensor,
                            mValueCache: cute.Tensor, mKScale: cute.Tensor,
                            mVScale: cute.Tensor, stream: cuda.CUstream,
                            VEC: cutlass.Constexpr[int], PAIRS: cutlass.Constexpr[int],
                            THREADS_PER_HEAD: cutlass.Constexpr[int],
                            WARPS: cutlass.Constexpr[int], ROTATED: cutlass.Constexpr[int],
                            IS_NEOX: cutlass.Constexpr[bool],
                            FROM_CACHE: cutlass.Constexpr[bool],
                            ROTARY_DIM: cutlass.Constexpr[int],
                            LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                            EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                            BLOCK_SIZE: cutlass.Constexpr[int],
                            FP8_CACHE: cutlass.Constexpr[bool]):
    heads_per_block = WARPS * WARP // THREADS_PER_HEAD
    tokens = cute.size(mQ, mode=[0])
    q_blocks = (tokens * cute.size(mQ, mode=[1]) + heads_per_block - 1) // heads_per_block
    k_blocks = (tokens * cute.size(mK, mode=[1]) + heads_per_block - 1) // heads_per_block
    _qk_norm_rope_kv_kernel(mPositions, mQ, mK, mV, mQW, mKW, mCache, mSlots, mKeyCache,
                            mValueCache, mKScale, mVScale, q_blocks, VEC, PAIRS,
                            THREADS_PER_HEAD, heads_per_block, ROTATED, IS_NEOX, FROM_CACHE,
                            ROTARY_DIM, LOG2_THETA, SCALING, EPS, WEIGHT_BIAS, BLOCK_SIZE,
                            FP8_CACHE).launch(grid=(q_blocks + k_blocks, 1, 1),
                                              block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: QKNormRopeKVProblem, config: QKNormRopeConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the token strides, the cos and sin cache's rows and the KV caches' blocks are
    symbolic, so the result serves every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    pairs = _pairs_per_vector(problem, config)
    tokens = cute.sym_int()

    def heads_tensor(heads: int):
        return fake_rows(dtype, tokens, (heads, problem.head_dim), vec, assumed_align=16)

    def weight_tensor():
        return fake_compact(dtype, (problem.head_dim,), assumed_align=16)

    def kv_cache():
        # Blocks are rows of block_size * kv_heads * head_dim elements: their stride is
        # symbolic and 64-bit, since a cache may pass 2^31 elements.
        return fake_rows(CACHE_DTYPES[problem.kv_cache_dtype], cute.sym_int(),
                         (problem.block_size, problem.kv_heads, problem.head_dim), vec,
                         assumed_align=16)

    def scale():
        return fake_compact(Float32, (1,), assumed_align=4)

    positions_type = rope_device.POSITION_TYPES[problem.positions_dtype]
    positions = fake_compact(positions_type, (tokens,), assumed_align=positions_type.width // 8)
    cache = fake_rows(CUTLASS_DTYPES[problem.cache_dtype], cute.sym_int(),
                      (problem.rotary_dim,), pairs, assumed_align=16)
    slots = fake_compact(Int64, (tokens,), assumed_align=8)
    return compile_launcher(
        _qk_norm_rope_kv_launch,
        (positions, heads_tensor(problem.q_heads), heads_tensor(problem.kv_heads),
         heads_tensor(problem.kv_heads), weight_tensor(), weight_tensor(), cache, slots,
         kv_cache(), kv_cache(), scale(), scale()),
        (vec, pairs, _threads_per_head(config), config.warps_per_block,
         int(_rotated_vectors(problem, config)), problem.style == NEOX,
         config.cos_sin == CACHE, problem.rotary_dim, math.log2(problem.theta),
         problem.frequency_scaling,
         float(problem.eps), float(problem.weight_bias), problem.block_size, problem.fp8),
        options)
