"""moe_dispatch's fused form (decode): one cooperative kernel of `grid_blocks` blocks. Block 0
routes every pair (a slot per pair from shared-memory atomic counters, then a warp's scan of the
padded counts gives the offsets), writes counts, offsets, row_of and the list of segments that
need padding; a grid barrier; then every block copies tokens and zeroes padding rows,
grid-stride."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import WARP
from cutetune.kernels.moe_dispatch.common import (
    COOPERATIVE_GRID_FITS,
    DECODE_GRIDS,
    FUSED,
    FUSED_MAX_PAIRS,
    WARPS_PARAM,
    FormConfig,
    scan_width,
    tokens_per_block_param,
    ws_padding,
)
from cutetune.kernels.moe_dispatch.device import (
    StoredRows,
    copy_units,
    finish_pairs,
    grid_barrier,
    pair_entries,
    route_pairs,
    routing_smem,
    scan_offsets,
    ws_view,
    zero_padding_rows,
)
from cutetune.spaces.space import Constraint, Param, Space


@dataclass(frozen=True)
class FusedConfig(FormConfig):
    form: ClassVar[str] = FUSED


FORM = Space(
    config_type=FusedConfig,
    params=(
        Param("grid_blocks", DECODE_GRIDS,
              "blocks of the kernel: block 0 routes, all copy (grid-stride)"),
        WARPS_PARAM,
        tokens_per_block_param(),
    ),
    constraints=(
        Constraint(
            "fused_routes_few_pairs",
            f"the fused form routes every pair in one block: at most {FUSED_MAX_PAIRS} pairs "
            "(tokens * top_k)",
            lambda p, c, d: p.num_tokens * p.top_k <= FUSED_MAX_PAIRS,
        ),
        COOPERATIVE_GRID_FITS,
    ),
)


@cute.kernel
def fused_kernel(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                 mCounts: cute.Tensor, mOffsets: cute.Tensor, mError: cute.Tensor,
                 mWs: cute.Tensor, K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                 PAD: cutlass.Constexpr[int], ZERO_PAD: cutlass.Constexpr[bool],
                 VEC: cutlass.Constexpr[int],
                 V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                 TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                 BLOCKS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    sCount, _, sOffsets, sPadStart, sPadEnd, sFlags = routing_smem(L)
    pad_list = ws_padding(L)
    mPadStart = ws_view(mWs, pad_list + 1, L)
    mPadEnd = ws_view(mWs, pad_list + 1 + L, L)
    pairs = cute.size(mIds, mode=[0]) * K
    if bidx == 0:
        # The first ids are loaded before anything waits on memory or on the block.
        experts = pair_entries(mIds, tidx, THREADS, pairs, K)
        for e in range(tidx, scan_width(L), THREADS):
            sCount[e] = 0
        if tidx == 0:
            sFlags[1] = 0
        cute.arch.sync_threads()
        slots = route_pairs(mIds, mRowOf, sCount, sFlags, experts, tidx, pairs, THREADS, K, E,
                            BEGIN, L)
        cute.arch.sync_threads()
        if tidx < WARP:
            scan_offsets(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
        cute.arch.sync_threads()
        for e in range(tidx, L, THREADS):
            mCounts[e] = sCount[e]
            mOffsets[e] = sOffsets[e]
        if tidx == 0:
            mOffsets[L] = sOffsets[L]
            mError[0] = sFlags[1]
        if cutlass.const_expr(ZERO_PAD):
            segments = sFlags[0]
            if tidx == 0:
                mWs[pad_list] = segments
            for i in range(tidx, segments, THREADS):
                mPadStart[i] = sPadStart[i]
                mPadEnd[i] = sPadEnd[i]
        finish_pairs(mIds, mRowOf, sOffsets, experts, slots, tidx, pairs, THREADS, K, BEGIN)
    grid_barrier(mWs, tidx, bidx, BLOCKS)
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    copy_units(gX, StoredRows(mRowOf), gDisp, cute.size(mRowOf, mode=[0]), tidx,
               bidx, BLOCKS, K, VEC, V, THREADS, TPB, SLICES, False, cache_hints.NORMAL)
    if cutlass.const_expr(ZERO_PAD):
        zero_padding_rows(gDisp, mPadStart, mPadEnd, mWs[pad_list], tidx, bidx, BLOCKS, VEC, V,
                          THREADS, SLICES)
