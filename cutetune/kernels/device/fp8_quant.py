"""FP8 per-token-group quantisation in CuTeDSL: the device pieces every FP8 group-quant kernel
shares (a group's amax over its lanes, its scale, the quantised stores), and the group kernel of
fp8_group_quant and silu_and_mul_fp8_quant with its launcher and compile.

A group's LANES lanes are consecutive lanes of one warp (LANES a power of two, at most 32), so
its amax is their NaN-quiet max (max.f32 returns the other operand where one is NaN) by
log2(LANES) butterfly shuffles; every lane then holds the scale and quantises its own vectors.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.activation import _activation
from cutetune.kernels.device.compiling import compile_launcher, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.fp8_group_quant import (
    GroupQuantConfig,
    GroupQuantProblem,
    _vector_elements,
)
from cutetune.kernels.fp8_quant import AMAX_FLOOR, E4M3_MAX, EXPONENT_MASK, MANTISSA_MASK

FP8 = cutlass.Float8E4M3FN


def absmax(vectors: list, amax=None) -> Float32:
    """The NaN-quiet max of |v| over fp32 register vectors (from `amax`, else 0)."""
    amax = Float32(0.0) if amax is None else amax
    for vector in vectors:
        magnitudes = cute.math.absf(vector)
        for i in range(cute.size(vector.shape)):
            amax = cute.arch.fmax(amax, magnitudes[i])
    return amax


def lanes_max(value: Float32, lanes: int) -> Float32:
    """`value`'s NaN-quiet max over each aligned group of `lanes` lanes of a warp, by butterfly
    shuffles: every lane of a group ends with its group's max."""
    for i in range(int(math.log2(lanes))):
        value = cute.arch.fmax(value, cute.arch.shuffle_sync_bfly(value, offset=lanes >> (i + 1)))
    return value


def group_scale(amax: Float32, ue8m0: bool) -> Float32:
    """max(amax, AMAX_FLOOR) / 448 (div.rn.f32); with ue8m0, rounded up to a power of two from
    its bits: adding the mantissa's all-ones carries into the exponent unless the mantissa is
    zero, and masking keeps the exponent alone (a positive normal or infinite scale, which the
    floor guarantees)."""
    scale = cute.arch.fmax(amax, Float32(AMAX_FLOOR)) / Float32(E4M3_MAX)
    if ue8m0:
        bits = scale.bitcast(Int32)
        scale = ((bits + MANTISSA_MASK) & EXPONENT_MASK).bitcast(Float32)
    return scale


def store_scale(mS: cute.Tensor, row, column, scale: Float32, column_major: bool) -> None:
    """The scale of group `column` of row `row`: mS is the (tokens, groups) scales, or for
    column-major scales their transpose (groups, tokens)."""
    if column_major:
        mS[column, row] = scale
    else:
        mS[row, column] = scale


def quantized(vector, scale: Float32):
    """An fp32 register vector times the scale's reciprocal (rcp.rn, once a group: the compiler
    keeps one per scale), as the reference multiplies, and rounded to e4m3 by cvt.rn.satfinite
    (nearest even, saturating to +-448, NaN kept). A div.rn.f32 an element instead made an FP8
    kernel several times slower at decode (docs/performance-notes.md)."""
    return (vector * (Float32(1.0) / scale)).to(FP8)


@cute.kernel
def _group_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor,
                        VEC: cutlass.Constexpr[int], LANES: cutlass.Constexpr[int],
                        GROUPS_PER_THREAD: cutlass.Constexpr[int],
                        THREADS: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                        ACTIVATION: cutlass.Constexpr, UE8M0: cutlass.Constexpr[bool],
                        COLUMN_MAJOR: cutlass.Constexpr[bool], HINTS: cutlass.Constexpr[str]):
    """The block's groups are numbered row-major over (tokens, groups of a row); slot s of the
    block (LANES lanes) takes groups first + s, first + s + SLOTS, ... and lane l of it the
    group's vectors l, l + LANES, ..., so each load instruction of a warp is coalesced. A group
    past the last is clamped onto the last (every lane joins the shuffles) and stores nothing.
    ACTIVATION None: the group is x's; else act(gate) * up of the fused gate-up row, rounded to
    x's dtype (what silu_and_mul writes)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % LANES
    slots = THREADS // LANES
    width = cute.size(mQ, mode=[1])
    groups_per_row = width // GROUP
    vectors_per_group = GROUP // VEC
    per_lane = vectors_per_group // LANES
    total = Int64(cute.size(mQ, mode=[0])) * groups_per_row
    first = Int64(bidx) * (slots * GROUPS_PER_THREAD) + tidx // LANES
    # Every load first, then the math and the stores, so a thread waits for one memory round
    # trip.
    groups, loads = [], []
    for k in cutlass.range_constexpr(GROUPS_PER_THREAD):
        flat = first + k * slots
        clamped = cutlass.min(flat, total - 1)
        row = Int32(clamped // groups_per_row)
        column = Int32(clamped - Int64(row) * groups_per_row)
        tXgX = cute.zipped_divide(mX[row, None], (VEC,))
        for j in cutlass.range_constexpr(per_lane):
            at = column * vectors_per_group + j * LANES + lane
            loads.append(cache_hints.load(tXgX[(None, at)], HINTS))
            if cutlass.const_expr(ACTIVATION is not None):
                loads.append(cache_hints.load(tXgX[(None, at + width // VEC)], HINTS))
        groups.append((flat, row, column))
    per_group = per_lane * (1 if ACTIVATION is None else 2)
    for k in cutlass.range_constexpr(GROUPS_PER_THREAD):
        flat, row, column = groups[k]
        values = []
        for j in cutlass.range_constexpr(per_lane):
            if cutlass.const_expr(ACTIVATION is None):
                values.append(loads[k * per_group + j].to(Float32))
            else:
                gate = loads[k * per_group + 2 * j].to(Float32)
                up = loads[k * per_group + 2 * j + 1].to(Float32)
                values.append((_activation(gate, ACTIVATION) * up).to(mX.element_type)
                              .to(Float32))
        scale = group_scale(lanes_max(absmax(values), LANES), UE8M0)
        if flat < total:
            tQgQ = cute.zipped_divide(mQ[row, None], (VEC,))
            for j in cutlass.range_constexpr(per_lane):
                at = column * vectors_per_group + j * LANES + lane
                cache_hints.store(tQgQ[(None, at)], quantized(values[j], scale), HINTS)
            if lane == 0:
                store_scale(mS, row, column, scale, COLUMN_MAJOR)


@cute.jit
def _group_quant_launch(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor,
                        stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                        LANES: cutlass.Constexpr[int], GROUPS_PER_THREAD: cutlass.Constexpr[int],
                        WARPS: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                        ACTIVATION: cutlass.Constexpr, UE8M0: cutlass.Constexpr[bool],
                        COLUMN_MAJOR: cutlass.Constexpr[bool], HINTS: cutlass.Constexpr[str]):
    threads = WARPS * WARP
    per_block = threads // LANES * GROUPS_PER_THREAD
    groups = Int64(cute.size(mQ, mode=[0])) * (cute.size(mQ, mode=[1]) // GROUP)
    blocks = Int32((groups + per_block - 1) // per_block)
    _group_quant_kernel(mX, mQ, mS, VEC, LANES, GROUPS_PER_THREAD, threads, GROUP, ACTIVATION,
                        UE8M0, COLUMN_MAJOR, HINTS).launch(grid=(blocks, 1, 1),
                                                           block=(threads, 1, 1), stream=stream)


def fake_scales(tokens, groups: int, column_major: bool):
    """The kernel's fake fp32 scales: (tokens, groups) rows, or for column-major scales their
    transpose (groups, tokens), whose row stride (the token stride) is symbolic too."""
    if not column_major:
        return fake_rows(Float32, tokens, (groups,), 1, assumed_align=4)
    return fake_rows(Float32, groups, (tokens,), 1, assumed_align=4)


def compile_kernel(problem: GroupQuantProblem, config: GroupQuantConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the row strides and the scales' stride are symbolic, so the result serves
    every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    width = problem.width
    tokens = cute.sym_int()
    x = fake_rows(dtype, tokens, ((2 if problem.activation else 1) * width,), vec,
                  assumed_align=16)
    q = fake_rows(FP8, tokens, (width,), vec, assumed_align=16)
    return compile_launcher(
        _group_quant_launch,
        (x, q, fake_scales(tokens, width // problem.group_size, problem.column_major_scales)),
        (vec, config.lanes_per_group, config.groups_per_thread, config.warps_per_block,
         problem.group_size, problem.activation, problem.ue8m0, problem.column_major_scales,
         config.cache_hints),
        options)
