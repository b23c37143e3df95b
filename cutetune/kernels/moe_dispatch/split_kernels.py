"""The kernels of moe_dispatch's split form (its config and knobs are split.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.moe_dispatch.common import (
    WS_COUNTERS,
    WS_EPOCH,
    publishes_counts,
    scan_width,
    ws_published,
)
from cutetune.kernels.moe_dispatch.device import (
    StoredRows,
    copy_units,
    finish_pairs,
    grid_barrier,
    pair_entries,
    route_pairs,
    routing_chunk,
    routing_smem,
    scan_offsets,
    ws_view,
    zero_padding_rows,
)


@cute.jit
def _add_counts(mWs: cute.Tensor, mTotals: cute.Tensor, sCount: cute.Tensor,
                sBase: cute.Tensor, sFlags: cute.Tensor, tidx: Int32, bidx: Int32,
                L: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                BLOCKS: cutlass.Constexpr[int]):
    """The atomic exchange: the block adds its counts to the global counters mTotals (one
    returning atomic per expert gives its base there) and its error flag to mTotals[L]; after
    the grid barrier sCount holds the totals and, in block 0, sFlags[2] the errors."""
    for e in range(tidx, L, THREADS):
        count = sCount[e]
        if count > 0:
            sBase[e] = cute.arch.atomic_add(mTotals.iterator + e, count, sem="relaxed",
                                            scope="gpu")
    if tidx == 0:
        if sFlags[1] != 0:
            cute.arch.atomic_add(mTotals.iterator + L, Int32(1), sem="relaxed", scope="gpu")
    grid_barrier(mWs, tidx, bidx, BLOCKS)
    for e in range(tidx, L, THREADS):
        sCount[e] = cute.arch.load(mTotals.iterator + e, Int32, sem="relaxed", scope="gpu")
    if bidx == 0:
        if tidx == 0:
            sFlags[2] = cute.arch.load(mTotals.iterator + L, Int32, sem="relaxed", scope="gpu")


@cute.jit
def _publish_counts(mWs: cute.Tensor, sCount: cute.Tensor, sBase: cute.Tensor,
                    sFlags: cute.Tensor, tidx: Int32, bidx: Int32, L: cutlass.Constexpr[int],
                    THREADS: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int]):
    """The published exchange (publishes_counts): block b stores its L counts and its error
    flag to row b of a (BLOCKS, L + 1) table in the workspace with plain stores, which the
    grid barrier's release and acquire order before every block's reads. Each block then sums
    column e over all rows (expert e's total, into sCount) and over the rows before its own
    (its base, into sBase), and the last column (the errors, into sFlags[2]). Every entry is
    rewritten each call, so nothing is zeroed between calls."""
    ROW = L + 1
    mTable = publish_row(mWs, sCount, sFlags, tidx, bidx, L, THREADS, BLOCKS)
    grid_barrier(mWs, tidx, bidx, BLOCKS)
    for e in range(tidx, L, THREADS):
        sCount[e] = 0
        sBase[e] = 0
    if tidx == 0:
        sFlags[2] = 0
    cute.arch.sync_threads()
    for i in range(tidx, BLOCKS * ROW, THREADS):
        block = i // ROW
        column = i - block * ROW
        # gpu scope: past any line of the table an earlier call left in this SM's L1.
        value = cute.arch.load(mTable.iterator + i, Int32, sem="relaxed", scope="gpu")
        if value != 0:
            if column == L:
                cute.arch.atomic_add(sFlags.iterator + 2, value, sem="relaxed", scope="cta")
            else:
                cute.arch.atomic_add(sCount.iterator + column, value, sem="relaxed",
                                     scope="cta")
                if block < bidx:
                    cute.arch.atomic_add(sBase.iterator + column, value, sem="relaxed",
                                         scope="cta")


@cute.jit
def publish_row(mWs: cute.Tensor, sCount: cute.Tensor, sFlags: cute.Tensor, tidx: Int32,
                bidx: Int32, L: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                BLOCKS: cutlass.Constexpr[int]) -> cute.Tensor:
    """Row bidx of the published (BLOCKS, L + 1) table: the block's L counts and its error
    flag (sFlags[1]), with plain stores. Returns the table."""
    ROW = L + 1
    mTable = ws_view(mWs, ws_published(L), BLOCKS * ROW)
    for e in range(tidx, L, THREADS):
        mTable[bidx * ROW + e] = sCount[e]
    if tidx == 0:
        mTable[bidx * ROW + L] = sFlags[1]
    return mTable


@cute.jit
def _route_chunks(mIds: cute.Tensor, mRowOf: cute.Tensor, mCounts: cute.Tensor,
                  mOffsets: cute.Tensor, mError: cute.Tensor, mWs: cute.Tensor, tidx: Int32,
                  bidx: Int32, K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                  BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                  PAD: cutlass.Constexpr[int], ZERO_PAD: cutlass.Constexpr[bool],
                  THREADS: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int]):
    """split's routing, by blocks 0 .. BLOCKS - 1 (all resident: they meet at a grid barrier),
    block `bidx` taking the bidx-th contiguous chunk of the pairs: counts, offsets, error and
    every pair's row_of written when it returns. The blocks exchange their counts as
    publishes_counts chooses (_publish_counts, _add_counts). Returns the block's
    padded-segment list (sPadStart, sPadEnd, with their count in sFlags[0]) for the zeroing."""
    PUBLISH = publishes_counts(L, BLOCKS)
    sCount, sBase, sOffsets, sPadStart, sPadEnd, sFlags = routing_smem(L)
    begin, end = routing_chunk(cute.size(mIds, mode=[0]) * K, bidx, BLOCKS)
    # The thread's first ids are loaded first, so that their round trip overlaps the epoch's
    # in the atomic exchange (the stores below depend on the epoch, and no load can be moved
    # above them).
    experts = pair_entries(mIds, begin + tidx, THREADS, end, K)
    if cutlass.const_expr(not PUBLISH):
        # This call counts into the counter set of its epoch's parity (zeroed by the previous
        # call) and zeroes the other set for the next call. Every block reads the epoch before
        # the barrier; block 0 advances it after.
        epoch = mWs[WS_EPOCH]
        parity = epoch & 1
        mTotals = cute.make_tensor(mWs.iterator + WS_COUNTERS + parity * (L + 1),
                                   cute.make_layout(L + 1))
        mNext = cute.make_tensor(mWs.iterator + WS_COUNTERS + (1 - parity) * (L + 1),
                                 cute.make_layout(L + 1))
        for i in range(bidx * THREADS + tidx, L + 1, BLOCKS * THREADS):
            mNext[i] = 0
    for e in range(tidx, scan_width(L), THREADS):
        sCount[e] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()
    slots = route_pairs(mIds, mRowOf, sCount, sFlags, experts, begin + tidx, end, THREADS, K,
                        E, BEGIN, L)
    cute.arch.sync_threads()
    if cutlass.const_expr(PUBLISH):
        _publish_counts(mWs, sCount, sBase, sFlags, tidx, bidx, L, THREADS, BLOCKS)
    else:
        _add_counts(mWs, mTotals, sCount, sBase, sFlags, tidx, bidx, L, THREADS, BLOCKS)
    cute.arch.sync_threads()
    if tidx < WARP:
        scan_offsets(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
    cute.arch.sync_threads()
    for e in range(tidx, L, THREADS):
        sBase[e] = sBase[e] + sOffsets[e]
    if bidx == 0:
        for e in range(tidx, L, THREADS):
            mCounts[e] = sCount[e]
            mOffsets[e] = sOffsets[e]
        if tidx == 0:
            mOffsets[L] = sOffsets[L]
            mError[0] = Int32(0)
            if sFlags[2] != 0:
                mError[0] = Int32(1)
            if cutlass.const_expr(not PUBLISH):
                mWs[WS_EPOCH] = epoch + 1
    cute.arch.sync_threads()
    finish_pairs(mIds, mRowOf, sBase, experts, slots, begin + tidx, end, THREADS, K, BEGIN)
    return sPadStart, sPadEnd, sFlags


@cute.kernel
def route_kernel(mIds: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                 mCounts: cute.Tensor, mOffsets: cute.Tensor, mError: cute.Tensor,
                 mWs: cute.Tensor, K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                 PAD: cutlass.Constexpr[int], ZERO_PAD: cutlass.Constexpr[bool],
                 VEC: cutlass.Constexpr[int],
                 V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                 SLICES: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    # The copy kernel may launch now: it loads x, then waits for this grid to finish.
    cute.arch.griddepcontrol_launch_dependents()
    sPadStart, sPadEnd, sFlags = _route_chunks(mIds, mRowOf, mCounts, mOffsets, mError, mWs,
                                               tidx, bidx, K, E, BEGIN, L, PAD, ZERO_PAD,
                                               THREADS, BLOCKS)
    if cutlass.const_expr(ZERO_PAD):
        gDisp = cute.zipped_divide(mDisp, (1, VEC))
        zero_padding_rows(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, BLOCKS, VEC, V, THREADS,
                          SLICES)


@cute.kernel
def copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                K: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    copy_units(gX, StoredRows(mRowOf), gDisp, cute.size(mRowOf, mode=[0]), tidx,
               bidx, gdim, K, VEC, V, THREADS, TPB, SLICES, True, HINTS)
