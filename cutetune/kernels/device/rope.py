"""RoPE's kernel, launcher and compile, as cutetune.kernels.rope declares them; its cos and sin
and its rotations of pairs serve qk_norm_rope's kernel too."""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.rope import (
    CACHE,
    LINEAR,
    LLAMA3,
    MROPE_SECTIONS,
    NEOX,
    STREAMS,
    YARN,
    RopeConfig,
    RopeProblem,
    _chunks,
    _pairs_per_vector,
    _q_head_groups,
    _threads_per_token,
    _vector_elements,
)

POSITION_TYPES = {"int32": cutlass.Int32, "int64": cutlass.Int64}
TWO_PI = 2.0 * math.pi


def cached_cos_sin(mCache: cute.Tensor, position, chunk: Int32, PAIRS: int):
    """The chunk's cos and sin, PAIRS fp32 scalars of each, from row `position` of the cache
    (cos in the first half of a row, sin in the second)."""
    tCgC = cute.zipped_divide(mCache[position, None], (PAIRS,))
    sin_offset = cute.size(mCache, mode=[1]) // 2 // PAIRS
    cos = tCgC[(None, chunk)].load().to(Float32)
    sin = tCgC[(None, chunk + sin_offset)].load().to(Float32)
    # Scalars here, before the q/k branch: an element taken from a vector inside one branch
    # would not be visible in the other.
    return [cos[j] for j in range(PAIRS)], [sin[j] for j in range(PAIRS)]


def _of_pair_stream(values: list, pair, MROPE: tuple, kind):
    """values[s] for the position stream s that pair `pair` (a device integer: it depends on
    the thread's chunk) rotates by, rope.mrope_stream's rule in selects; `kind` wraps the
    result (a select gives a bare MLIR value)."""
    layout, t, h, w = MROPE
    if layout == MROPE_SECTIONS:
        return kind(cutlass.select_(pair >= t + h, values[2],
                                    cutlass.select_(pair >= t, values[1], values[0])))
    third = pair % 3
    height = cutlass.select_(pair < 3 * h, cutlass.select_(third == 1, values[1], values[0]),
                             values[0])
    return kind(cutlass.select_(pair < 3 * w, cutlass.select_(third == 2, values[2], height),
                                height))


def _mrope_cached_cos_sin(mCache: cute.Tensor, positions: list, chunk: Int32, PAIRS: int,
                          MROPE: tuple):
    """The chunk's cos and sin under mrope: the chunk's part of the cache row of each stream's
    position, and each pair's from the row of its stream."""
    rows = [cached_cos_sin(mCache, position, chunk, PAIRS) for position in positions]
    cos, sin = [], []
    for j in range(PAIRS):
        pair = chunk * PAIRS + j
        cos.append(_of_pair_stream([row[0][j] for row in rows], pair, MROPE, Float32))
        sin.append(_of_pair_stream([row[1][j] for row in rows], pair, MROPE, Float32))
    return cos, sin


def _llama3_scaled(inverse, NUMBERS: tuple):
    """Llama 3's scaling of a pair's fp64 frequency: kept where the pair turns more than
    high_freq_factor times over the original context, divided by the factor where it turns
    fewer than low_freq_factor times, blended by where it lies between (the blend's weight
    clamped to [0, 1] is transformers' three cases in one)."""
    factor, low, high, context = NUMBERS
    turns = inverse * (context / TWO_PI)
    weight = cutlass.max(cutlass.min((turns - low) * (1.0 / (high - low)), Float64(1.0)),
                         Float64(0.0))
    return inverse * (weight + (1.0 - weight) * (1.0 / factor))


def _yarn_scaled(inverse, pair, NUMBERS: tuple):
    """YaRN's scaling of a pair's fp64 frequency: divided by the factor with the weight of the
    pair's place on the ramp from low to high (clamped to [0, 1]), kept with the rest."""
    factor, low, high, _ = NUMBERS
    ramp = cutlass.max(cutlass.min((Float64(pair) - low) * (1.0 / (high - low)), Float64(1.0)),
                       Float64(0.0))
    return inverse * (1.0 - ramp + ramp * (1.0 / factor))


def computed_cos_sin(positions: list, chunk: Int32, PAIRS: int, ROTARY_DIM: int,
                      LOG2_THETA: float, SCALING: tuple, MROPE):
    """The chunk's cos and sin, PAIRS fp32 scalars of each, computed from the position: pair
    i's frequency theta^(-2i/ROTARY_DIM) and its angle in fp64, so the angle is exact far below
    fp32's resolution (an fp32 angle at position 2^17 is off by up to 0.008 rad); the angle
    reduced to [-pi, pi] in fp64, then sine and cosine in fp32 without fast-math
    approximations. SCALING: RopeProblem.frequency_scaling, (scaling, its numbers), which
    scales the frequencies (linear scaling: times the factor's reciprocal, in fp64); YaRN's
    attention factor multiplies cos and sin in fp32. `positions`: the
    token's one position, or under mrope (MROPE: RopeProblem.mrope_sections) its three, each
    pair's angle taken from its stream's."""
    kind, numbers = SCALING
    step = -2.0 * LOG2_THETA / ROTARY_DIM
    first = cute.math.exp2(Float64(chunk * PAIRS) * step, fastmath=False)
    angles_of = [Float64(position) for position in positions]
    cos, sin = [], []
    for j in range(PAIRS):
        inverse = first * (2.0 ** (step * j))
        if kind == LLAMA3:
            inverse = _llama3_scaled(inverse, numbers)
        elif kind == YARN:
            inverse = _yarn_scaled(inverse, chunk * PAIRS + j, numbers)
        elif kind == LINEAR:
            inverse = inverse * (1.0 / numbers[0])
        angle_of = angles_of[0]
        if MROPE is not None:
            angle_of = _of_pair_stream(angles_of, chunk * PAIRS + j, MROPE, Float64)
        angle = angle_of * inverse
        turns = cute.math.roundeven(angle * (1.0 / TWO_PI))
        reduced = Float32(angle - turns * TWO_PI)
        cos.append(cute.math.cos(reduced, fastmath=False))
        sin.append(cute.math.sin(reduced, fastmath=False))
        if kind == YARN:
            cos[j], sin[j] = cos[j] * numbers[3], sin[j] * numbers[3]
    return cos, sin


def rotated_halves(x1, x2, cos: list, sin: list, PAIRS: int):
    """NeoX style: (x1 cos - x2 sin, x2 cos + x1 sin) of fp32 vectors x1 and x2, the first and
    second halves of PAIRS pairs, by their cos and sin (PAIRS fp32 scalars each)."""
    y1 = cute.make_rmem_tensor((PAIRS,), Float32)
    y2 = cute.make_rmem_tensor((PAIRS,), Float32)
    for p in range(PAIRS):
        y1[p] = x1[p] * cos[p] - x2[p] * sin[p]
        y2[p] = x2[p] * cos[p] + x1[p] * sin[p]
    return y1.load(), y2.load()


def rotated_interleaved(x, cos: list, sin: list, PAIRS: int):
    """GPT-J style: fp32 vector x of PAIRS (even, odd) pairs, each rotated by its cos and sin
    (PAIRS fp32 scalars each)."""
    y = cute.make_rmem_tensor((2 * PAIRS,), Float32)
    for p in range(PAIRS):
        y[2 * p] = x[2 * p] * cos[p] - x[2 * p + 1] * sin[p]
        y[2 * p + 1] = x[2 * p + 1] * cos[p] + x[2 * p] * sin[p]
    return y.load()


@cute.jit
def _rotate_heads(mX: cute.Tensor, token, group: Int32, chunk: Int32, cos, sin,
                  VEC: cutlass.Constexpr[int], PAIRS: cutlass.Constexpr[int],
                  HALF_VECTORS: cutlass.Constexpr[int],
                  HEADS_PER_THREAD: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool]):
    """Rotate this thread's chunk of heads group * HEADS_PER_THREAD ... of `token` in mX by the
    chunk's cos and sin. A NeoX chunk is vector `chunk` of the first half and vector
    chunk + HALF_VECTORS of the second; a GPT-J chunk is one vector of PAIRS interleaved pairs.
    Every load is issued before the first store, so the heads' loads overlap; a head past the
    last loads the last head again and stores nothing."""
    heads = cute.size(mX, mode=[1])
    tXgX = []
    firsts = []
    seconds = []
    for j in cutlass.range_constexpr(HEADS_PER_THREAD):
        head = cutlass.min(group * HEADS_PER_THREAD + j, heads - 1)
        tXgX.append(cute.zipped_divide(mX[token, head, None], (VEC,)))
        firsts.append(tXgX[j][(None, chunk)].load().to(Float32))
        if cutlass.const_expr(IS_NEOX):
            seconds.append(tXgX[j][(None, chunk + HALF_VECTORS)].load().to(Float32))
    for j in cutlass.range_constexpr(HEADS_PER_THREAD):
        if group * HEADS_PER_THREAD + j < heads:
            if cutlass.const_expr(IS_NEOX):
                y1, y2 = rotated_halves(firsts[j], seconds[j], cos, sin, PAIRS)
                tXgX[j][(None, chunk)].store(y1.to(mX.element_type))
                tXgX[j][(None, chunk + HALF_VECTORS)].store(y2.to(mX.element_type))
            else:
                y = rotated_interleaved(firsts[j], cos, sin, PAIRS)
                tXgX[j][(None, chunk)].store(y.to(mX.element_type))


@cute.kernel
def _rope_kernel(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor, mCache: cute.Tensor,
                 VEC: cutlass.Constexpr[int], PAIRS: cutlass.Constexpr[int],
                 CHUNKS: cutlass.Constexpr[int], HALF_VECTORS: cutlass.Constexpr[int],
                 HEADS_PER_THREAD: cutlass.Constexpr[int], Q_GROUPS: cutlass.Constexpr[int],
                 THREADS_PER_TOKEN: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                 FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                 LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                 MROPE: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    # 64-bit: tokens * THREADS_PER_TOKEN passes 2^31 from about a million tokens.
    thread = cutlass.Int64(bidx) * bdim + tidx
    token = thread // THREADS_PER_TOKEN
    if token < cute.size(mQ, mode=[0]):
        # Chunks vary fastest: a warp's accesses to one head are contiguous.
        rest = Int32(thread - token * THREADS_PER_TOKEN)
        group = rest // CHUNKS
        chunk = rest % CHUNKS
        if cutlass.const_expr(MROPE is None):
            positions = [mPositions[token]]
        else:
            positions = [mPositions[stream, token] for stream in range(STREAMS)]
        if cutlass.const_expr(FROM_CACHE and MROPE is None):
            cos, sin = cached_cos_sin(mCache, positions[0], chunk, PAIRS)
        elif cutlass.const_expr(FROM_CACHE):
            cos, sin = _mrope_cached_cos_sin(mCache, positions, chunk, PAIRS, MROPE)
        else:
            cos, sin = computed_cos_sin(positions, chunk, PAIRS, ROTARY_DIM, LOG2_THETA,
                                        SCALING, MROPE)
        # Groups [0, Q_GROUPS) rotate q heads, the rest k heads: a group never spans both.
        if group < Q_GROUPS:
            _rotate_heads(mQ, token, group, chunk, cos, sin, VEC, PAIRS, HALF_VECTORS,
                          HEADS_PER_THREAD, IS_NEOX)
        else:
            _rotate_heads(mK, token, group - Q_GROUPS, chunk, cos, sin, VEC, PAIRS,
                          HALF_VECTORS, HEADS_PER_THREAD, IS_NEOX)


@cute.jit
def _rope_launch(mPositions: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor, mCache: cute.Tensor,
                 stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                 PAIRS: cutlass.Constexpr[int], CHUNKS: cutlass.Constexpr[int],
                 HALF_VECTORS: cutlass.Constexpr[int], HEADS_PER_THREAD: cutlass.Constexpr[int],
                 Q_GROUPS: cutlass.Constexpr[int], THREADS_PER_TOKEN: cutlass.Constexpr[int],
                 WARPS: cutlass.Constexpr[int], IS_NEOX: cutlass.Constexpr[bool],
                 FROM_CACHE: cutlass.Constexpr[bool], ROTARY_DIM: cutlass.Constexpr[int],
                 LOG2_THETA: cutlass.Constexpr[float], SCALING: cutlass.Constexpr,
                 MROPE: cutlass.Constexpr):
    threads = WARPS * WARP
    needed = cutlass.Int64(cute.size(mQ, mode=[0])) * THREADS_PER_TOKEN
    _rope_kernel(mPositions, mQ, mK, mCache, VEC, PAIRS, CHUNKS, HALF_VECTORS, HEADS_PER_THREAD,
                 Q_GROUPS, THREADS_PER_TOKEN, IS_NEOX, FROM_CACHE, ROTARY_DIM, LOG2_THETA,
                 SCALING, MROPE).launch(grid=(Int32((needed + threads - 1) // threads), 1, 1),
                                      block=(threads, 1, 1), stream=stream)


def fake_heads(dtype, rows, heads: int, head_dim: int, vec: int, assumed_align: int):
    """A fake (rows, heads, head_dim) tensor, compact within a head, whose row stride (64-bit)
    and head stride are both symbolic multiples of `vec` elements: the heads of a fused qkv
    projection, or the strided tails of wider heads (MLA's rotated dims: the last 64 of each
    192-wide DeepSeek-V3 q head). Here, not in compiling.py, whose code every kernel's hash
    holds."""
    return cute.runtime.make_fake_tensor(
        dtype, (rows, heads, head_dim),
        (cute.sym_int64(divisibility=vec), cute.sym_int(divisibility=vec), 1),
        assumed_align=assumed_align)


def compile_kernel(problem: RopeProblem, config: RopeConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the token and head strides and the cache's rows are symbolic, so the result
    serves every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    pairs = _pairs_per_vector(problem, config)
    tokens = cute.sym_int()

    def heads_tensor(heads: int):
        return fake_heads(dtype, tokens, heads, problem.head_dim, vec, assumed_align=16)

    positions_type = POSITION_TYPES[problem.positions_dtype]
    positions = fake_compact(positions_type, (tokens,) if problem.mrope_sections is None
                             else (STREAMS, tokens), assumed_align=positions_type.width // 8)
    cache = fake_rows(CUTLASS_DTYPES[problem.cache_dtype], cute.sym_int(),
                      (problem.rotary_dim,), pairs, assumed_align=16)
    return compile_launcher(
        _rope_launch,
        (positions, heads_tensor(problem.q_heads), heads_tensor(problem.kv_heads), cache),
        (vec, pairs, _chunks(problem, config), problem.rotary_dim // 2 // vec,
         config.heads_per_thread, _q_head_groups(problem, config),
         _threads_per_token(problem, config), config.warps_per_block, problem.style == NEOX,
         config.cos_sin == CACHE, problem.rotary_dim, math.log2(problem.theta),
         problem.frequency_scaling, problem.mrope_sections),
        options)
