"""The kernels of moe_dispatch's fused form (its config and knobs are fused.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.moe_dispatch.common import scan_width, ws_padding
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
