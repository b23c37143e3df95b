"""The kernels of moe_dispatch's replicated form (its config and knobs are replicated.py)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.moe_dispatch.common import (
    REPLICATED_MAX_PAIRS,
    copy_unit_total,
    preloaded_units,
    replicated_ids_per_thread,
    scan_width,
)
from cutetune.kernels.moe_dispatch.device import (
    copy_units,
    local_expert,
    pair_entries,
    routing_smem,
    scan_offsets,
    unit_loads,
    unit_position,
    unit_stores,
    zero_padding_rows,
)


def _pair_tensors(warps: int, L: int):
    """The replicated form's per-pair local expert and rank, and each warp's per-expert counts
    (allocated after routing_smem)."""
    smem = cutlass.memory.SmemAllocator()
    sLocal = smem.allocate_tensor(Int32, cute.make_layout(REPLICATED_MAX_PAIRS),
                                  byte_alignment=16)
    sRank = smem.allocate_tensor(Int32, cute.make_layout(REPLICATED_MAX_PAIRS),
                                 byte_alignment=16)
    sHist = smem.allocate_tensor(Int32, cute.make_layout(warps * scan_width(L)),
                                 byte_alignment=16)
    return sLocal, sRank, sHist


@cute.jit
def _same_key_lanes(key: Int32, BITS: cutlass.Constexpr[int]) -> cutlass.Uint32:
    """The lanes of the warp whose key (0 <= key < 2^BITS) equals this lane's: match.any
    built from one ballot per key bit (this lane's bit kept where it is 1, flipped where it is
    0). On the H200 the rank phase takes markedly fewer cycles this way than with match.any
    (measured with clock64 in an instrumented copy of the kernel)."""
    same = cutlass.Uint32(0xFFFFFFFF)
    for b in cutlass.range_constexpr(BITS):
        bit = (key >> b) & 1
        ones = cutlass.Uint32(cute.arch.vote_ballot_sync(bit != 0))
        same = same & (ones ^ cutlass.Uint32(bit - 1))  # bit - 1: all ones where bit is 0
    return same


@cute.jit
def _rank_pairs(sLocal: cute.Tensor, sRank: cute.Tensor, sHist: cute.Tensor, pairs: Int32,
                warp: Int32, lane: Int32, WARPS: cutlass.Constexpr[int],
                KEY_BITS: cutlass.Constexpr[int]):
    """Warp `warp` of WARPS, over the 32-pair steps warp, warp + WARPS, ... in order:
    sRank[pair] = the pair's rank among this warp's pairs of its local expert (sHist[expert],
    the warp's count so far, plus the lanes before it with the same expert); sHist ends as
    the warp's counts. Pairs of no local expert (sLocal -1) are left alone. Nothing depends
    on timing, so every block gets the same ranks."""
    for first in range(warp * WARP, pairs, WARPS * WARP):
        pair = first + lane
        local = Int32(-1)
        if pair < pairs:
            local = sLocal[pair]
        same = _same_key_lanes(local + 1, KEY_BITS)
        before = Int32(cute.arch.popc(same & cute.arch.lanemask_lt()))
        seen = Int32(0)
        if local >= 0:
            seen = sHist[local]
        # Every lane of an expert has read its count before the last of them adds the step's.
        cute.arch.sync_warp()
        if local >= 0:
            sRank[pair] = seen + before
            if (same & cute.arch.lanemask_gt()) == 0:
                sHist[local] = seen + Int32(cute.arch.popc(same))
        cute.arch.sync_warp()


@cute.jit
def _ranked_row(sLocal: cute.Tensor, sRank: cute.Tensor, sOffsets: cute.Tensor,
                sBase: cute.Tensor, pair: Int32, WARPS: cutlass.Constexpr[int],
                WIDTH: cutlass.Constexpr[int]) -> Int32:
    """The replicated form's row of a pair: its expert's offset, plus the pairs of that
    expert the warps before its ranking warp counted (sBase), plus its rank there; -1 for a
    pair of no local expert. Without a branch, so that the shared-memory reads of a token's
    pairs overlap (a pair of no local expert reads expert 0's entries and an unset rank, and
    discards them)."""
    local = sLocal[pair]
    is_local = Int32(local >= 0)
    expert = local * is_local
    warp = (pair // WARP) % WARPS
    row = sOffsets[expert] + sBase[warp * WIDTH + expert] + sRank[pair]
    return is_local * (row + 1) - 1


@dataclass(frozen=True)
class _RankedRows:
    """row_of(token, k) for the replicated form: computed from its shared-memory ranks."""
    sLocal: cute.Tensor
    sRank: cute.Tensor
    sOffsets: cute.Tensor
    sBase: cute.Tensor
    K: int
    WARPS: int
    WIDTH: int

    def __call__(self, token: Int32, k: int) -> Int32:
        return _ranked_row(self.sLocal, self.sRank, self.sOffsets, self.sBase,
                           token * self.K + k, self.WARPS, self.WIDTH)


@cute.kernel
def replicated_kernel(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor,
                      mDisp: cute.Tensor, mCounts: cute.Tensor, mOffsets: cute.Tensor,
                      mError: cute.Tensor, K: cutlass.Constexpr[int],
                      E: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int],
                      L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                      ZERO_PAD: cutlass.Constexpr[bool], VEC: cutlass.Constexpr[int],
                      V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                      TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                      BLOCKS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    WARPS = THREADS // WARP
    warp = tidx // WARP
    lane = tidx - warp * WARP
    WIDTH = scan_width(L)
    sCount, _, sOffsets, sPadStart, sPadEnd, sFlags = routing_smem(L)
    sLocal, sRank, sHist = _pair_tensors(WARPS, L)
    tokens = cute.size(mIds, mode=[0])
    pairs = tokens * K
    units = copy_unit_total(tokens, TPB, SLICES)
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    # x does not depend on routing: the block's first units' vectors are loaded now and land
    # while it routes. A unit this block does not have loads its first unit again.
    PRELOADED_UNITS = preloaded_units(TPB)
    preloaded = []
    for i in cutlass.range_constexpr(PRELOADED_UNITS):
        unit = bidx + i * BLOCKS * Int32(bidx + i * BLOCKS < units)
        group, column = unit_position(unit, tidx, SLICES, THREADS)
        preloaded.append(unit_loads(gX, tokens, group, cutlass.min(column, V - 1), VEC, TPB))
    # Every id the thread routes (a block routes at most REPLICATED_MAX_PAIRS pairs), loaded
    # before the barrier too, so that their round trip overlaps x's and the barrier's.
    IDS_PER_THREAD = replicated_ids_per_thread(THREADS)
    experts = pair_entries(mIds, tidx, THREADS, pairs, K, IDS_PER_THREAD)
    for i in range(tidx, WARPS * WIDTH, THREADS):
        sHist[i] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()  # the error flag is cleared before any thread raises it
    for i in cutlass.range_constexpr(IDS_PER_THREAD):
        pair = tidx + i * THREADS
        if pair < pairs:
            sLocal[pair] = local_expert(experts[i], sFlags, E, BEGIN, L)
    cute.arch.sync_threads()
    # Each warp ranks its steps of 32 pairs into its row of sHist; an exclusive scan over the
    # warps then turns sHist into each warp's base within each expert.
    sWarpHist = cute.make_tensor(sHist.iterator + warp * WIDTH, cute.make_layout(WIDTH))
    # Keys local + 1 in [0, L]: the ballots cover the pairs of no local expert too.
    _rank_pairs(sLocal, sRank, sWarpHist, pairs, warp, lane, WARPS, L.bit_length())
    cute.arch.sync_threads()
    for e in range(tidx, WIDTH, THREADS):
        total = Int32(0)
        for w in cutlass.range_constexpr(WARPS):
            count = sHist[w * WIDTH + e]
            sHist[w * WIDTH + e] = total
            total = total + count
        sCount[e] = total
    cute.arch.sync_threads()
    if tidx < WARP:
        scan_offsets(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
    cute.arch.sync_threads()
    row_of = _RankedRows(sLocal, sRank, sOffsets, sHist, K, WARPS, WIDTH)

    # Every block computed the same layout: block 0 writes the counts and offsets, and the
    # block that copies a token group's first slice writes the group's rows.
    if bidx == 0:
        for e in range(tidx, L, THREADS):
            mCounts[e] = sCount[e]
            mOffsets[e] = sOffsets[e]
        if tidx == 0:
            mOffsets[L] = sOffsets[L]
            mError[0] = sFlags[1]
    for unit in range(bidx, units, BLOCKS):
        group = unit // SLICES
        if unit == group * SLICES:
            for p in range(tidx, TPB * K, THREADS):
                pair = group * (TPB * K) + p
                if pair < pairs:
                    token = pair // K
                    k = pair - token * K
                    mRowOf[token, k] = row_of(token, k)
    for i in cutlass.range_constexpr(PRELOADED_UNITS):
        unit = bidx + i * BLOCKS
        group, column = unit_position(unit, tidx, SLICES, THREADS)
        if unit < units and column < V:
            unit_stores(gDisp, preloaded[i], row_of, tokens, group, column, K, TPB)
    copy_units(gX, row_of, gDisp, tokens, tidx, bidx + PRELOADED_UNITS * BLOCKS, BLOCKS, K,
               VEC, V, THREADS, TPB, SLICES, False, cache_hints.NORMAL)
    if cutlass.const_expr(ZERO_PAD):
        zero_padding_rows(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, BLOCKS, VEC, V, THREADS,
                          SLICES)
