"""The kernels of moe_dispatch's split_block_ranks form (its config and knobs are
split_block_ranks.py)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.moe_dispatch.common import IDS_IN_FLIGHT, scan_width, ws_published
from cutetune.kernels.moe_dispatch.device import (
    chunk_pairs,
    pair_entries,
    routing_chunk,
    routing_smem,
    scan_offsets,
    slot_entries,
    store_slot_values,
    unit_loads,
    unit_position,
    unit_stores,
    ws_view,
    zero_padding_rows,
)
from cutetune.kernels.moe_dispatch.split_kernels import publish_row


@cute.kernel
def rank_kernel(mIds: cute.Tensor, mRowOf: cute.Tensor, mWs: cute.Tensor,
                K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                THREADS: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int]):
    """split_block_ranks' routing: block `bidx` ranks the pairs of its contiguous chunk in their
    local experts (shared-memory atomics), stores each pair's rank in row_of as
    rank_code, and its L counts and its error flag to row bidx of the published table
    (ws_published). No block waits for another: the copy kernel's dependent-launch wait, for
    this whole grid, is the only barrier, and that kernel resolves the ranks into rows."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    # The copy kernel may launch now: it loads x, then waits for this grid to finish.
    cute.arch.griddepcontrol_launch_dependents()
    sCount, _, _, _, _, sFlags = routing_smem(L)
    begin, end = routing_chunk(cute.size(mIds, mode=[0]) * K, bidx, BLOCKS)
    first = begin + tidx
    experts = pair_entries(mIds, first, THREADS, end, K)
    for e in range(tidx, L, THREADS):
        sCount[e] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()

    def code_of(slot, expert):
        return rank_code(slot, expert - BEGIN, L)

    store_slot_values(experts, slot_entries(experts, sCount, sFlags, first, end, THREADS, E,
                                              BEGIN, L),
                      code_of, mRowOf, first, end, THREADS, K)
    for base in range(first + IDS_IN_FLIGHT * THREADS, end, IDS_IN_FLIGHT * THREADS):
        later = pair_entries(mIds, base, THREADS, end, K)
        store_slot_values(later, slot_entries(later, sCount, sFlags, base, end, THREADS, E,
                                                BEGIN, L),
                          code_of, mRowOf, base, end, THREADS, K)
    cute.arch.sync_threads()
    publish_row(mWs, sCount, sFlags, tidx, bidx, L, THREADS, BLOCKS)


def rank_code(rank: Int32, local: Int32, L: int) -> Int32:
    """A pair's rank in its routing block and its local expert, as split_block_ranks' routing
    leaves them in row_of: -2 - (rank * L + local), below any row and the -1 of no row."""
    return -2 - (rank * L + local)


def rank_of_code(code: Int32, L: int) -> tuple:
    """rank_code's (rank, local expert) back from a code below -1."""
    value = -2 - code
    rank = value // L
    return rank, value - rank * L


def _block_rank_tensors(L: int, BLOCKS: int, PAIRS: int):
    """A split_block_ranks copy block's routing table, each routing block's base in each expert
    and its group's PAIRS rows (allocated after routing_smem)."""
    smem = cutlass.memory.SmemAllocator()
    sTable = smem.allocate_tensor(Int32, cute.make_layout(BLOCKS * (L + 1)), byte_alignment=16)
    sBases = smem.allocate_tensor(Int32, cute.make_layout(BLOCKS * L), byte_alignment=16)
    sRows = smem.allocate_tensor(Int32, cute.make_layout(PAIRS), byte_alignment=16)
    return sTable, sBases, sRows


@cute.jit
def _resolve_ranks(mRowOf: cute.Tensor, mWs: cute.Tensor, mCounts: cute.Tensor,
                   mOffsets: cute.Tensor, mError: cute.Tensor, smem_tensors: tuple,
                   rank_tensors: tuple, lane: Int32, bidx: Int32, group: Int32,
                   first_slice: cutlass.Boolean, pairs: Int32, K: cutlass.Constexpr[int],
                   L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                   ZERO_PAD: cutlass.Constexpr[bool], TPB: cutlass.Constexpr[int],
                   BLOCKS: cutlass.Constexpr[int]):
    """Warp 0 of a split_block_ranks copy block, once routing has finished: the rows of its
    group's TPB * K pairs into sRows, from their rank codes in row_of and the routing blocks'
    table. Every copy block reads that table whole, so its reads are as few as possible: one
    load per lane per 32 words (the lanes' columns interleaved in shared memory), issued
    together with the rank codes' loads. The block of a group's first slice stores the
    group's rows to row_of, and copy block 0 the counts, offsets and error. With ZERO_PAD the
    padded-segment list lands in sPadStart, sPadEnd (their count in sFlags[0]).
    smem_tensors and rank_tensors: as routing_smem and _block_rank_tensors allocate them."""
    sCount, _, sOffsets, sPadStart, sPadEnd, sFlags = smem_tensors
    sTable, sBases, sRows = rank_tensors
    ROW = L + 1
    WORDS = BLOCKS * ROW
    GROUP_PAIRS = TPB * K
    # gpu scope: row_of's entries are rewritten by other blocks of this kernel (the same
    # value: the row), and no line of the table from an earlier call may be read from L1.
    codes = []
    for j in cutlass.range_constexpr((GROUP_PAIRS + WARP - 1) // WARP):
        pair = cutlass.min(group * GROUP_PAIRS + lane + j * WARP, pairs - 1)
        codes.append(cute.arch.load(mRowOf.iterator + pair, Int32, sem="relaxed", scope="gpu"))
    mTable = ws_view(mWs, ws_published(L), WORDS)
    words = []
    for j in cutlass.range_constexpr((WORDS + WARP - 1) // WARP):
        word = cutlass.min(lane + j * WARP, WORDS - 1)
        words.append(cute.arch.load(mTable.iterator + word, Int32, sem="relaxed", scope="gpu"))
    for j in cutlass.range_constexpr((WORDS + WARP - 1) // WARP):
        if lane + j * WARP < WORDS:
            sTable[lane + j * WARP] = words[j]
    cute.arch.sync_warp()
    # Lane e sums column e: the total of expert e (the errors in the last column), and each
    # routing block's base, the counts of the blocks before it. Unrolled, so that the
    # shared-memory loads of a column overlap.
    for e in cutlass.range_constexpr((max(scan_width(L), L + 1) + WARP - 1) // WARP):
        expert = lane + e * WARP
        total = Int32(0)
        if expert <= L:
            for b in cutlass.range_constexpr(BLOCKS):
                count = sTable[b * ROW + expert]
                if expert < L:
                    sBases[b * L + expert] = total
                total = total + count
        if expert == L:
            sFlags[2] = total
        if expert < scan_width(L):
            sCount[expert] = total * Int32(expert < L)
    cute.arch.sync_warp()
    scan_offsets(sCount, sOffsets, sPadStart, sPadEnd, sFlags, lane, L, PAD, ZERO_PAD)
    cute.arch.sync_warp()
    for j in cutlass.range_constexpr((GROUP_PAIRS + WARP - 1) // WARP):
        index = lane + j * WARP
        pair = group * GROUP_PAIRS + index
        if index < GROUP_PAIRS and pair < pairs:
            row = codes[j]
            if row < -1:
                rank, local = rank_of_code(row, L)
                block = pair // chunk_pairs(pairs, BLOCKS)
                row = sOffsets[local] + sBases[block * L + local] + rank
                if first_slice:
                    cute.arch.store(mRowOf.iterator + pair, row, sem="relaxed", scope="gpu")
            sRows[index] = row
    if bidx == 0:
        for e in range(lane, L, WARP):
            mCounts[e] = sCount[e]
            mOffsets[e] = sOffsets[e]
        if lane == 0:
            mOffsets[L] = sOffsets[L]
            mError[0] = Int32(sFlags[2] != 0)


@dataclass(frozen=True)
class _GroupRows:
    """row_of(token, k) for split_block_ranks' copy: its group's rows, resolved into sRows."""
    sRows: cute.Tensor
    group: Int32
    K: int
    TPB: int

    def __call__(self, token: Int32, k: int) -> Int32:
        return self.sRows[(token - self.group * self.TPB) * self.K + k]


@cute.kernel
def block_ranks_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                            mCounts: cute.Tensor, mOffsets: cute.Tensor, mError: cute.Tensor,
                            mWs: cute.Tensor, K: cutlass.Constexpr[int],
                            L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                            ZERO_PAD: cutlass.Constexpr[bool], VEC: cutlass.Constexpr[int],
                            V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                            TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                            BLOCKS: cutlass.Constexpr[int], HINTS: cutlass.Constexpr[str]):
    """split_block_ranks' copy: one unit per block. The block loads its x vectors, waits for
    routing, resolves its group's rows (_resolve_ranks, warp 0), stores the vectors there and
    zeroes its share of the padding rows."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    tokens = cute.size(mX, mode=[0])
    group, column = unit_position(bidx, tidx, SLICES, THREADS)
    values = unit_loads(gX, tokens, group, cutlass.min(column, V - 1), VEC, TPB, HINTS)
    smem_tensors = routing_smem(L)
    rank_tensors = _block_rank_tensors(L, BLOCKS, TPB * K)
    _, _, _, sPadStart, sPadEnd, sFlags = smem_tensors
    sRows = rank_tensors[2]
    cute.arch.griddepcontrol_wait()
    if tidx < WARP:
        _resolve_ranks(mRowOf, mWs, mCounts, mOffsets, mError, smem_tensors, rank_tensors, tidx,
                       bidx, group, bidx == group * SLICES, tokens * K, K, L, PAD, ZERO_PAD,
                       TPB, BLOCKS)
    cute.arch.sync_threads()
    if column < V:
        unit_stores(gDisp, values, _GroupRows(sRows, group, K, TPB), tokens, group, column, K,
                    TPB, HINTS)
    if cutlass.const_expr(ZERO_PAD):
        zero_padding_rows(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, gdim, VEC, V, THREADS,
                          SLICES)
