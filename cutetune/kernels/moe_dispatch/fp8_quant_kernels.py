"""The kernels of moe_dispatch_fp8_quant (its declaration is kernels/moe_dispatch_fp8_quant.py):
split's routing kernel, unchanged, then a copy kernel that quantises each token's row once and
stores its e4m3 codes and scales to each of the token's rows; its launcher and its compile.

A quantisation group of GROUP elements is GROUP / VEC vectors over LANES consecutive lanes (each
PER_LANE of them, lane-strided so that a warp's loads are coalesced); the block's SLOTS =
THREADS / LANES group slots take the row's groups SLOTS at a time (a slice). A unit is (a group
of TPB tokens, a slice), as moe_dispatch's copy units are; a slot past the row's last group
loads and quantises the last one again (every lane joins its group's shuffles) and stores
nothing. With zero_padding the copy also writes the padding rows, zero codes and an all-zero
group's scale, each block taking whole experts' padding (grid-stride): routing leaves its own
zeroing off, since q's padding rows need their scales too.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.device.fp8_quant import (
    FP8,
    absmax,
    fake_scales,
    group_scale,
    lanes_max,
    quantized,
    store_scale,
)
from cutetune.kernels.dtypes import vector_elements
from cutetune.kernels.moe_dispatch.common import copy_unit_total, workspace_words
from cutetune.kernels.moe_dispatch.device import unit_loads, unit_position
from cutetune.kernels.moe_dispatch.split_kernels import route_kernel
from cutetune.kernels.moe_dispatch_fp8_quant import (
    VECTOR_BITS,
    DispatchFP8QuantConfig,
    MoEDispatchFP8QuantProblem,
)


def _flat(fragment: cute.Tensor) -> cute.Tensor:
    """A (1, VEC) register fragment (unit_loads') as a (VEC,) vector of the same registers."""
    return cute.make_tensor(fragment.iterator, cute.make_layout(cute.size(fragment)))


def _quantized_unit(gX: cute.Tensor, tokens: Int32, group: Int32, column: Int32, lane: Int32,
                    VEC: int, LANES: int, GROUP: int, TPB: int, UE8M0: bool, HINTS: str):
    """Group `column` of tokens group * TPB + [0, TPB) (a token past the last is the last
    again): this lane's vectors of each, every load issued before any math, quantised with
    the group's scale (the max over its LANES lanes). Returns the e4m3 codes, PER_LANE (1, VEC)
    register fragments per token, and each token's scale."""
    PER_LANE = GROUP // (VEC * LANES)
    first = column * (GROUP // VEC) + lane
    loads = [unit_loads(gX, tokens, group, first + j * LANES, VEC, TPB, HINTS)
             for j in range(PER_LANE)]
    codes, scales = [], []
    for i in range(TPB):
        values = [_flat(loads[j][i]).load().to(Float32) for j in range(PER_LANE)]
        scale = group_scale(lanes_max(absmax(values), LANES), UE8M0)
        for value in values:
            # A register fragment, not a TensorSSA: the stores below are under branches.
            fragment = cute.make_rmem_tensor(cute.make_layout((1, VEC)), FP8)
            _flat(fragment).store(quantized(value, scale))
            codes.append(fragment)
        scales.append(scale)
    return codes, scales


@cute.jit
def _store_unit(gQ: cute.Tensor, mS: cute.Tensor, mRowOf: cute.Tensor, codes: list,
                scales: list, tokens: Int32, group: Int32, column: Int32, lane: Int32,
                K: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                LANES: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                GROUPS: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                COLUMN_MAJOR: cutlass.Constexpr[bool], HINTS: cutlass.Constexpr[str]):
    """_quantized_unit's codes and scales stored to each of their tokens' rows, row_of[token,
    k] (skipped where negative); the group's first lane stores the scale. Every row index is
    read before the first store (as moe_dispatch's unit_stores reads them)."""
    PER_LANE = GROUP // (VEC * LANES)
    first = column * (GROUP // VEC) + lane
    rows = []
    for i in cutlass.range_constexpr(TPB):
        token = cutlass.min(group * TPB + i, tokens - 1)
        for k in cutlass.range_constexpr(K):
            rows.append(mRowOf[token, k])
    for i in cutlass.range_constexpr(TPB):
        for k in cutlass.range_constexpr(K):
            row = rows[i * K + k]
            if row >= 0 and group * TPB + i < tokens and column < GROUPS:
                for j in cutlass.range_constexpr(PER_LANE):
                    cache_hints.store_from(codes[i * PER_LANE + j],
                                           gQ[(None, (row, first + j * LANES))], HINTS)
                if lane == 0:
                    store_scale(mS, row, column, scales[i], COLUMN_MAJOR)


@cute.jit
def _zero_padding(gQ: cute.Tensor, mS: cute.Tensor, mCounts: cute.Tensor,
                  mOffsets: cute.Tensor, slot: Int32, lane: Int32, first_expert: Int32,
                  expert_stride: Int32, L: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                  LANES: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                  GROUPS: cutlass.Constexpr[int], SLOTS: cutlass.Constexpr[int],
                  SLICES: cutlass.Constexpr[int], UE8M0: cutlass.Constexpr[bool],
                  COLUMN_MAJOR: cutlass.Constexpr[bool]):
    """Experts first_expert, first_expert + expert_stride, ...: each padding row of the
    expert's segment (offsets[e] + counts[e] up to offsets[e + 1]) gets zero codes and the
    scale of an all-zero group (group_scale of 0, as the reference's zero rows have)."""
    PER_LANE = GROUP // (VEC * LANES)
    zero_values = cute.make_rmem_tensor((VEC,), Float32)
    zero_values.fill(0.0)
    zeros = cute.make_rmem_tensor(cute.make_layout((1, VEC)), FP8)
    _flat(zeros).store(zero_values.load().to(FP8))
    scale = group_scale(Float32(0.0), UE8M0)
    for expert in range(first_expert, L, expert_stride):
        for row in range(mOffsets[expert] + mCounts[expert], mOffsets[expert + 1]):
            for s in cutlass.range_constexpr(SLICES):
                column = s * SLOTS + slot
                if column < GROUPS:
                    first = column * (GROUP // VEC) + lane
                    for j in cutlass.range_constexpr(PER_LANE):
                        cute.autovec_copy(zeros, gQ[(None, (row, first + j * LANES))])
                    if lane == 0:
                        store_scale(mS, row, column, scale, COLUMN_MAJOR)


@cute.kernel
def quant_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor,
                      mCounts: cute.Tensor, mOffsets: cute.Tensor, K: cutlass.Constexpr[int],
                      L: cutlass.Constexpr[int], ZERO_PAD: cutlass.Constexpr[bool],
                      VEC: cutlass.Constexpr[int], LANES: cutlass.Constexpr[int],
                      THREADS: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                      SLICES: cutlass.Constexpr[int], GROUP: cutlass.Constexpr[int],
                      UE8M0: cutlass.Constexpr[bool], COLUMN_MAJOR: cutlass.Constexpr[bool],
                      HINTS: cutlass.Constexpr[str]):
    """Launched early behind the routing kernel (programmatic dependent launch): each unit's
    loads and quantisation come first (x does not depend on routing), then the wait for
    routing, then the reads of row_of and the stores."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    SLOTS = THREADS // LANES
    GROUPS = cute.size(mX, mode=[1]) // GROUP
    slot = tidx // LANES
    lane = tidx - slot * LANES
    tokens = cute.size(mRowOf, mode=[0])
    gX = cute.zipped_divide(mX, (1, VEC))
    gQ = cute.zipped_divide(mQ, (1, VEC))
    for unit in range(bidx, copy_unit_total(tokens, TPB, SLICES), gdim):
        group, column = unit_position(unit, slot, SLICES, SLOTS)
        codes, scales = _quantized_unit(gX, tokens, group, cutlass.min(column, GROUPS - 1),
                                        lane, VEC, LANES, GROUP, TPB, UE8M0, HINTS)
        cute.arch.griddepcontrol_wait()
        _store_unit(gQ, mS, mRowOf, codes, scales, tokens, group, column, lane, K, VEC, LANES,
                    GROUP, GROUPS, TPB, COLUMN_MAJOR, HINTS)
    if cutlass.const_expr(ZERO_PAD):
        cute.arch.griddepcontrol_wait()
        _zero_padding(gQ, mS, mCounts, mOffsets, slot, lane, bidx, gdim, L, VEC, LANES, GROUP,
                      GROUPS, SLOTS, SLICES, UE8M0, COLUMN_MAJOR)


@cute.jit
def _dispatch_quant_launch(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor,
                           mQ: cute.Tensor, mS: cute.Tensor, mCounts: cute.Tensor,
                           mOffsets: cute.Tensor, mError: cute.Tensor, mWs: cute.Tensor,
                           stream: cuda.CUstream, K: cutlass.Constexpr[int],
                           E: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int],
                           L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                           ZERO_PAD: cutlass.Constexpr[bool], VEC: cutlass.Constexpr[int],
                           LANES: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                           TPB: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int],
                           GROUP: cutlass.Constexpr[int], UE8M0: cutlass.Constexpr[bool],
                           COLUMN_MAJOR: cutlass.Constexpr[bool],
                           HINTS: cutlass.Constexpr[str]):
    SLOTS = THREADS // LANES
    SLICES = (cute.size(mX, mode=[1]) // GROUP + SLOTS - 1) // SLOTS
    units = copy_unit_total(cute.size(mX, mode=[0]), TPB, SLICES)
    # split's routing with its zeroing off (ZERO_PAD False, so mQ and the vector counts it
    # would zero with are never read): the copy writes the padding rows and their scales.
    route_kernel(mIds, mRowOf, mQ, mCounts, mOffsets, mError, mWs, K, E, BEGIN, L, PAD, False,
                 VEC, cute.size(mX, mode=[1]) // VEC, THREADS, SLICES, BLOCKS).launch(
        grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
    blocks = cutlass.max(units, 1)
    if cutlass.const_expr(ZERO_PAD):
        # A block per expert's padding at least: few tokens have few units.
        blocks = cutlass.max(units, L)
    quant_copy_kernel(mX, mRowOf, mQ, mS, mCounts, mOffsets, K, L, ZERO_PAD, VEC, LANES,
                      THREADS, TPB, SLICES, GROUP, UE8M0, COLUMN_MAJOR, HINTS).launch(
        grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)


def compile_kernel(problem: MoEDispatchFP8QuantProblem, config: DispatchFP8QuantConfig,
                   options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors in the
    op's order (x, topk_ids, row_of, q, scales, counts, offsets, error, workspace): the token
    count and the rows of q and of the scales (one symbolic extent: the launch checks they
    agree) are symbolic, so the result serves every call."""
    vec = vector_elements(problem.dtype, VECTOR_BITS)
    tokens, rows = cute.sym_int(), cute.sym_int()
    L = problem.local_experts

    def ints(*shape):
        return fake_compact(cutlass.Int32, shape, assumed_align=4)

    tensors = (fake_rows(CUTLASS_DTYPES[problem.dtype], tokens, (problem.hidden,), vec,
                         assumed_align=16),
               ints(tokens, problem.top_k), ints(tokens, problem.top_k),
               fake_rows(FP8, rows, (problem.hidden,), vec, assumed_align=16),
               fake_scales(rows, problem.hidden // problem.group_size,
                           problem.column_major_scales),
               ints(L), ints(L + 1), ints(1), ints(workspace_words(L)))
    return compile_launcher(
        _dispatch_quant_launch, tensors,
        (problem.top_k, problem.experts, problem.expert_begin, L, problem.pad,
         problem.zero_padding and problem.pad > 1, vec, config.lanes_per_group,
         config.warps_per_block * WARP, config.tokens_per_block, config.grid_blocks,
         problem.group_size, problem.ue8m0, problem.column_major_scales, config.cache_hints),
        options)
