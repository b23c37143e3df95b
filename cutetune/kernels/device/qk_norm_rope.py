"""qk_norm_rope's kernel, launcher and compile, as cutetune.kernels.qk_norm_rope declares them.

The norm is device_blocks' pieces joined as qk_norm's kernel joins them, and the cos and sin and
the rotations are rope's device functions. qk_norm's own head function is not called: it stores
what it normalises, and splitting it would change qk_norm's code hash and so drop its shipped
H200 winners. This kernel's head is split so (normed_rotated, then store_row): qk_norm_rope_kv's
kernel calls both, storing k into the KV cache too.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import blocks as device_blocks
from cutetune.kernels.device import rope as rope_device
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.qk_norm_rope import (
    CACHE,
    NEOX,
    QKNormRopeConfig,
    QKNormRopeProblem,
    _pairs_per_vector,
    _rotated_vectors,
    _threads_per_head,
    _vector_elements,
)


@cute.jit
def normed_rotated(mX: cute.Tensor, mW: cute.Tensor, mPositions: cute.Tensor,
                   mCache: cute.Tensor, row: Int32, lane: Int32, VEC: cutlass.Constexpr[int],
                   PAIRS: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                   ROTATED: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                   FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                   LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                   EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float],
                   tied: list):
    """Head `row` (token-major over mX's (tokens, heads)) normalised, then rotated, by its
    THREADS_PER_HEAD threads: its token and this thread's fp32 vectors of it (vector v is the
    head's vector v * THREADS_PER_HEAD + lane). The thread's first ROTATED vectors rotate: in
    NeoX style each with its partner ROTATED vectors on (rotary_dim / 2 elements on), in GPT-J
    style each by itself. Threads past the last head compute a valid head, so that every lane
    joins the shuffles; the caller stores only where row is below the heads. `tied`: the
    caller's loaded values (as device_blocks.tied_zero takes them) that it uses only after the
    shuffles, tied before them so that ptxas does not sink their loads below them."""
    heads = cute.size(mX, mode=[1])
    head_dim = cute.size(mX, mode=[2])
    rows = cute.size(mX, mode=[0]) * heads
    safe_row = cutlass.min(row, rows - 1)
    token = safe_row // heads
    tXgX = cute.zipped_divide(mX[token, safe_row % heads, None], (VEC,))
    tWgW = cute.zipped_divide(mW, (VEC,))
    vectors_per_thread = head_dim // (VEC * THREADS_PER_HEAD)
    # The position first: the cache rows wait for it.
    position = mPositions[token]
    tWrW = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        tWrW.append(device_blocks.preload_fp32(tWgW, v * THREADS_PER_HEAD + lane))
    square_sum = device_blocks.tied_zero(tWrW + tied)
    tXrX = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        x = tXgX[(None, v * THREADS_PER_HEAD + lane)].load().to(Float32)
        tXrX.append(x)
        square_sum = square_sum + device_blocks.sum_of_squares(x)
    # The rotated vectors' cos and sin before the shuffles, so their loads (or arithmetic)
    # overlap the head's.
    cos = []
    sin = []
    for v in cutlass.range_constexpr(ROTATED):
        chunk = v * THREADS_PER_HEAD + lane
        if cutlass.const_expr(FROM_CACHE):
            c, s = rope_device.cached_cos_sin(mCache, position, chunk, PAIRS)
        else:
            # One position stream, no YaRN: the problem refuses both (qk_norm_rope.SCALINGS).
            c, s = rope_device.computed_cos_sin([position], chunk, PAIRS, ROTARY_DIM, LOG2_THETA,
                                                SCALING, None)
        cos.append(c)
        sin.append(s)
        if cutlass.const_expr(FROM_CACHE):
            # ptxas sinks the cache loads, needed only after the shuffles, below them (as it
            # does the weights', device_blocks.tied_zero says): tie each to the sum.
            square_sum = square_sum + device_blocks.tied_zero([(x,) for x in c + s])
    square_sum = device_blocks.butterfly_sum(square_sum, THREADS_PER_HEAD)
    inv_rms = device_blocks.inverse_rms(square_sum, head_dim, EPS)
    y = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        y.append(device_blocks.rms_normalised(tXrX[v], inv_rms, tWrW[v], WEIGHT_BIAS))
    for v in cutlass.range_constexpr(ROTATED):
        if cutlass.const_expr(IS_NEOX):
            y[v], y[v + ROTATED] = rope_device.rotated_halves(y[v], y[v + ROTATED], cos[v],
                                                              sin[v], PAIRS)
        else:
            y[v] = rope_device.rotated_interleaved(y[v], cos[v], sin[v], PAIRS)
    return token, y


@cute.jit
def norm_rope_head(mX: cute.Tensor, mW: cute.Tensor, mPositions: cute.Tensor,
                   mCache: cute.Tensor, row: Int32, lane: Int32, VEC: cutlass.Constexpr[int],
                   PAIRS: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                   ROTATED: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                   FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                   LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                   EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float]):
    """Normalise and rotate head `row` in place (normed_rotated, then its store)."""
    token, y = normed_rotated(mX, mW, mPositions, mCache, row, lane, VEC, PAIRS,
                              THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE, ROTARY_DIM,
                              LOG2_THETA, SCALING, EPS, WEIGHT_BIAS, [])
    heads = cute.size(mX, mode=[1])
    if row < cute.size(mX, mode=[0]) * heads:
        store_row(mX[token, row % heads, None], y, lane, VEC, THREADS_PER_HEAD)


@cute.jit
def store_row(mRow: cute.Tensor, y: list, lane: Int32, VEC: cutlass.Constexpr[int],
              THREADS_PER_HEAD: cutlass.Constexpr[int]):
    """Store a thread's vectors of a head (as normed_rotated holds them) into mRow, the head's
    (head_dim,) row, converted to mRow's type."""
    tXgX = cute.zipped_divide(mRow, (VEC,))
    for v in cutlass.range_constexpr(len(y)):
        tXgX[(None, v * THREADS_PER_HEAD + lane)].store(y[v].to(mRow.element_type))


@cute.kernel
def _qk_norm_rope_kernel(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
                         mQW: cute.Tensor, mKW: cute.Tensor, mCache: cute.Tensor,
                         q_blocks: Int32, VEC: cutlass.Constexpr[int],
                         PAIRS: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                         HEADS_PER_BLOCK: cutlass.Constexpr[int],
                         ROTATED: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                         FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                         LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                         EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % THREADS_PER_HEAD
    slot = tidx // THREADS_PER_HEAD
    if bidx < q_blocks:
        norm_rope_head(mQ, mQW, mPositions, mCache, bidx * HEADS_PER_BLOCK + slot, lane, VEC,
                       PAIRS, THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE, ROTARY_DIM,
                       LOG2_THETA, SCALING, EPS, WEIGHT_BIAS)
    else:
        norm_rope_head(mK, mKW, mPositions, mCache, (bidx - q_blocks) * HEADS_PER_BLOCK + slot,
                       lane, VEC, PAIRS, THREADS_PER_HEAD, ROTATED, IS_NEOX, FROM_CACHE,
                       ROTARY_DIM, LOG2_THETA, SCALING, EPS, WEIGHT_BIAS)


@cute.jit
def _qk_norm_rope_launch(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
                         mQW: cute.Tensor, mKW: cute.Tensor, mCache: cute.Tensor,
                         stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                         PAIRS: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                         WARPS: cutlass.Constexpr[int], ROTATED: cutlass.Constexpr[int],
                         IS_NEOX: cutlass.Constexpr[bool], FROM_CACHE: cutlass.Constexpr[bool],
                         ROTARY_DIM: cutlass.Constexpr[int], LOG2_THETA: cutlass.Constexpr[float],
                         SCALING: cutlass.Constexpr, EPS: cutlass.Constexpr[float],
                         WEIGHT_BIAS: cutlass.Constexpr[float]):
    heads_per_block = WARPS * WARP // THREADS_PER_HEAD
    tokens = cute.size(mQ, mode=[0])
    q_blocks = (tokens * cute.size(mQ, mode=[1]) + heads_per_block - 1) // heads_per_block
    k_blocks = (tokens * cute.size(mK, mode=[1]) + heads_per_block - 1) // heads_per_block
    _qk_norm_rope_kernel(mPositions, mQ, mK, mQW, mKW, mCache, q_blocks, VEC, PAIRS,
                         THREADS_PER_HEAD, heads_per_block, ROTATED, IS_NEOX, FROM_CACHE,
                         ROTARY_DIM, LOG2_THETA, SCALING, EPS,
                         WEIGHT_BIAS).launch(grid=(q_blocks + k_blocks, 1, 1),
                                             block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: QKNormRopeProblem, config: QKNormRopeConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the token strides and the cache's rows are symbolic, so the result serves
    every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    pairs = _pairs_per_vector(problem, config)
    tokens = cute.sym_int()

    def heads_tensor(heads: int):
        return fake_rows(dtype, tokens, (heads, problem.head_dim), vec, assumed_align=16)

    def weight_tensor():
        return fake_compact(dtype, (problem.head_dim,), assumed_align=16)

    positions_type = rope_device.POSITION_TYPES[problem.positions_dtype]
    positions = fake_compact(positions_type, (tokens,), assumed_align=positions_type.width // 8)
    cache = fake_rows(CUTLASS_DTYPES[problem.cache_dtype], cute.sym_int(),
                      (problem.rotary_dim,), pairs, assumed_align=16)
    return compile_launcher(
        _qk_norm_rope_launch,
        (positions, heads_tensor(problem.q_heads), heads_tensor(problem.kv_heads),
         weight_tensor(), weight_tensor(), cache),
        (vec, pairs, _threads_per_head(config), config.warps_per_block,
         int(_rotated_vectors(problem, config)), problem.style == NEOX,
         config.cos_sin == CACHE, problem.rotary_dim, math.log2(problem.theta),
         problem.frequency_scaling, float(problem.eps), float(problem.weight_bias)),
        options)
