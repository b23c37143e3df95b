"""The device code moe_dispatch's forms share: the grid barrier, the routing pieces (expert ids
loaded ahead, slots from shared-memory counters, rows, the warp scan of the padded counts), the
copy pieces (units of tokens times row slices, loaded once and stored to each pair's row) and
the shared-memory and workspace views they work in."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.moe_dispatch.common import (
    IDS_IN_FLIGHT,
    SMEM_FLAGS,
    WS_BARRIER,
    copy_unit_total,
    scan_width,
)


def barrier_increment(blocks: int, block: int) -> int:
    """What block `block` of `blocks` adds to the barrier word (as a signed 32-bit value).

    Block 0 adds 2^31 - (blocks - 1), every other block 1: once all have arrived the word has
    grown by exactly 2^31, so its top bit has flipped and its low 31 bits are back where they
    were. Before the last arrival the sum is below 2^31, so the top bit cannot flip early.
    (The scheme of CUDA's cooperative-groups grid sync.)"""
    if block:
        return 1
    value = (1 << 31) - (blocks - 1)
    return value - (1 << 32) if value >= 1 << 31 else value


@cute.jit
def grid_barrier(mWs: cute.Tensor, tidx: Int32, bidx: Int32, BLOCKS: cutlass.Constexpr[int]):
    """Wait until all BLOCKS blocks of this cooperative grid arrive.

    Thread 0 arrives with a gpu-scope release add on the barrier word (ordering its block's
    earlier writes, gathered by the block barrier, before the arrival), then spins with
    gpu-scope acquire loads until the word's top bit differs from the value it saw when it
    arrived; the chain of atomic adds carries every block's release to that acquire. The word
    returns to its starting low bits after every barrier whatever BLOCKS is, so consecutive
    barriers, calls and configs share it with no reset."""
    cute.arch.sync_threads()
    if tidx == 0:
        increment = Int32(1)
        if bidx == 0:
            increment = Int32(barrier_increment(BLOCKS, 0))
        word = mWs.iterator + WS_BARRIER
        arrived = cute.arch.atomic_add(word, increment, sem="release", scope="gpu")
        seen = cute.arch.load(word, Int32, sem="acquire", scope="gpu")
        while (seen ^ arrived) >= 0:  # same top bit: not everyone has arrived yet
            seen = cute.arch.load(word, Int32, sem="acquire", scope="gpu")
    cute.arch.sync_threads()


def pair_entries(mPairs: cute.Tensor, first: Int32, stride: Int32, end: Int32,
                 K: int, count: int = IDS_IN_FLIGHT) -> list:
    """mPairs (tokens, K) at pairs first, first + stride, ... (count of them; those past end
    read the last pair again): every load issued before any value is used, so a thread's
    pairs cost one memory round trip per count, not one each."""
    values = []
    for i in range(count):
        pair = cutlass.min(first + i * stride, end - 1)
        token = pair // K
        values.append(mPairs[token, pair - token * K])
    return values


@cute.jit
def local_expert(expert: Int32, sFlags: cute.Tensor, E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int]) -> Int32:
    """The pair's local expert, or -1 when its expert is not local; an id outside [0, E) is
    skipped the same way and raises sFlags[1]."""
    local = expert - BEGIN
    if expert < 0 or expert >= E:
        sFlags[1] = 1
        local = Int32(-1)
    elif local < 0 or local >= L:
        local = Int32(-1)
    return local


@cute.jit
def slot_entries(experts: list, sCount: cute.Tensor, sFlags: cute.Tensor, first: Int32,
                 end: Int32, stride: Int32, E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int]) -> list:
    """The slots of pairs first, first + stride, ... (their experts loaded by pair_entries) in
    their local experts, from shared-memory atomic counters; -1 for a pair of no local expert
    or past end."""
    slots = []
    for i in cutlass.range_constexpr(len(experts)):
        slot = Int32(-1)
        if first + i * stride < end:
            local = local_expert(experts[i], sFlags, E, BEGIN, L)
            if local >= 0:
                slot = cute.arch.atomic_add(sCount.iterator + local, Int32(1),
                                            sem="relaxed", scope="cta")
        slots.append(slot)
    return slots


@cute.jit
def store_slot_values(experts: list, slots: list, value_of, mRowOf: cute.Tensor,
                      first: Int32, end: Int32, stride: Int32, K: cutlass.Constexpr[int]):
    """row_of of pairs first, first + stride, ... below end: value_of(slot, expert) of the
    pair's slot and expert id (its row, or split_block_ranks' rank_code), or -1 where it has
    no slot."""
    for i in cutlass.range_constexpr(len(experts)):
        pair = first + i * stride
        if pair < end:
            value = Int32(-1)
            if slots[i] >= 0:
                value = value_of(slots[i], experts[i])
            token = pair // K
            mRowOf[token, pair - token * K] = value


@cute.jit
def route_pairs(mIds: cute.Tensor, mRowOf: cute.Tensor, sCount: cute.Tensor,
                sFlags: cute.Tensor, experts: list, first: Int32, end: Int32, stride: Int32,
                K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int]) -> list:
    """The thread's pairs first, first + stride, ... below end get a slot (slot_entries).
    The first IDS_IN_FLIGHT, whose experts the caller loaded ahead of its own round trips,
    keep theirs in registers (returned); the rest, IDS_IN_FLIGHT at a time, store theirs in
    row_of for now."""
    slots = slot_entries(experts, sCount, sFlags, first, end, stride, E, BEGIN, L)
    for base in range(first + IDS_IN_FLIGHT * stride, end, stride * IDS_IN_FLIGHT):
        later = slot_entries(pair_entries(mIds, base, stride, end, K), sCount, sFlags, base,
                             end, stride, E, BEGIN, L)
        for i in cutlass.range_constexpr(IDS_IN_FLIGHT):
            pair = base + i * stride
            if pair < end:
                token = pair // K
                mRowOf[token, pair - token * K] = later[i]
    return slots


@cute.jit
def finish_pairs(mIds: cute.Tensor, mRowOf: cute.Tensor, sBase: cute.Tensor, experts: list,
                 slots: list, first: Int32, end: Int32, stride: Int32,
                 K: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int]):
    """row_of of route_pairs' pairs (the same thread each): the expert's base + the slot, from
    registers for the first IDS_IN_FLIGHT, from row_of (with the ids reloaded) for the rest."""
    def row_of(slot, expert):
        return slot + sBase[expert - BEGIN]

    store_slot_values(experts, slots, row_of, mRowOf, first, end, stride, K)
    for base in range(first + IDS_IN_FLIGHT * stride, end, stride * IDS_IN_FLIGHT):
        store_slot_values(pair_entries(mIds, base, stride, end, K),
                          pair_entries(mRowOf, base, stride, end, K), row_of, mRowOf, base,
                          end, stride, K)


@cute.jit
def scan_offsets(sTotal: cute.Tensor, sOffsets: cute.Tensor, sPadStart: cute.Tensor,
                 sPadEnd: cute.Tensor, sFlags: cute.Tensor, lane: Int32, L: cutlass.Constexpr[int],
                 PAD: cutlass.Constexpr[int], ZERO_PAD: cutlass.Constexpr[bool]):
    """One warp: offsets = exclusive scan of the counts rounded up to PAD; with ZERO_PAD, the
    segments with padding rows listed as [start, end) row ranges (their count in sFlags[0],
    which is 0 without ZERO_PAD). Lane l owns
    experts [l * PER_LANE, (l + 1) * PER_LANE): a serial pass, a shuffle scan of the lane
    sums, and a second serial pass writing the results."""
    PER_LANE = (L + WARP - 1) // WARP
    first = lane * PER_LANE
    rows = Int32(0)
    padded_segments = Int32(0)
    for i in cutlass.range_constexpr(PER_LANE):
        count = sTotal[first + i]  # zero past L: the arrays hold 32 * PER_LANE experts
        rows = rows + (count + (PAD - 1)) // PAD * PAD
        if cutlass.const_expr(ZERO_PAD):
            padded_segments = padded_segments + Int32(count % PAD != 0)
    rows_through = rows
    segments_through = padded_segments
    for i in cutlass.range_constexpr(5):
        rows_before = cute.arch.shuffle_sync_up(rows_through, 1 << i)
        segments_before = Int32(0)
        if cutlass.const_expr(ZERO_PAD):
            segments_before = cute.arch.shuffle_sync_up(segments_through, 1 << i)
        if lane >= (1 << i):
            rows_through = rows_through + rows_before
            segments_through = segments_through + segments_before
    row = rows_through - rows
    segment = segments_through - padded_segments
    for i in cutlass.range_constexpr(PER_LANE):
        count = sTotal[first + i]
        padded = (count + (PAD - 1)) // PAD * PAD
        sOffsets[first + i] = row
        if cutlass.const_expr(ZERO_PAD):
            if padded != count:
                sPadStart[segment] = row + count
                sPadEnd[segment] = row + padded
            segment = segment + Int32(padded != count)
        row = row + padded
    if lane == WARP - 1:
        sOffsets[L] = rows_through
        sFlags[0] = segments_through


@dataclass(frozen=True)
class StoredRows:
    """row_of(token, k) for the copy helpers: the rows routing stored in row_of (fused,
    split)."""
    mRowOf: cute.Tensor

    def __call__(self, token: Int32, k: int) -> Int32:
        return self.mRowOf[token, k]


def unit_position(unit: Int32, tidx: Int32, SLICES: int, THREADS: int) -> tuple:
    """Unit u's token group (or padded segment), u // SLICES, and the thread's vector in the
    row, (u % SLICES) * THREADS + tidx."""
    group = unit // SLICES
    return group, (unit - group * SLICES) * THREADS + tidx


def unit_loads(gX: cute.Tensor, tokens: Int32, group: Int32, column: Int32,
               VEC: int, TPB: int, HINTS: str = cache_hints.NORMAL) -> list:
    """Vector `column` of tokens group * TPB + [0, TPB) of gX ((1, VEC), (rows, V)), in
    register fragments, loaded with the cache hints HINTS: every load issued before any is
    used. A token past the last loads the last one again (the stores skip it)."""
    values = []
    for i in range(TPB):
        token = cutlass.min(group * TPB + i, tokens - 1)
        # A register fragment copied in and out with autovec_copy, not a TensorSSA: a
        # TensorSSA stored under two different branches trips the tracer (its element cache
        # is born inside the first branch).
        fragment = cute.make_rmem_tensor(cute.make_layout((1, VEC)), gX.element_type)
        cache_hints.load_into(gX[(None, (token, column))], fragment, HINTS)
        values.append(fragment)
    return values


@cute.jit
def unit_stores(gDisp: cute.Tensor, values: list, row_of, tokens: Int32, group: Int32,
                column: Int32, K: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                HINTS: cutlass.Constexpr[str] = cache_hints.NORMAL):
    """Store unit_loads' vectors to each of their tokens' rows, row_of(token, k) (skipped
    where negative), with the cache hints HINTS. Every row index is read before the first
    store: the compiler cannot move a load above a store it cannot prove disjoint, and one
    round trip per pair would serialise."""
    rows = []
    for i in cutlass.range_constexpr(TPB):
        token = cutlass.min(group * TPB + i, tokens - 1)
        for k in cutlass.range_constexpr(K):
            rows.append(row_of(token, k))
    for i in cutlass.range_constexpr(TPB):
        for k in cutlass.range_constexpr(K):
            if rows[i * K + k] >= 0 and group * TPB + i < tokens:
                cache_hints.store_from(values[i], gDisp[(None, (rows[i * K + k], column))],
                                       HINTS)


@cute.jit
def copy_units(gX: cute.Tensor, row_of, gDisp: cute.Tensor, tokens: Int32, tidx: Int32,
               first_unit: Int32, unit_stride: Int32, K: cutlass.Constexpr[int],
               VEC: cutlass.Constexpr[int], V: cutlass.Constexpr[int],
               THREADS: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
               SLICES: cutlass.Constexpr[int], AFTER_ROUTING: cutlass.Constexpr[bool],
               HINTS: cutlass.Constexpr[str]):
    """Units first_unit, first_unit + unit_stride, ...: unit u copies vector
    (u % SLICES) * THREADS + tidx (of the row's V) of tokens (u // SLICES) * TPB + [0, TPB) to
    each of their rows, row_of(token, k) (a pair's row, or negative: none). gX and gDisp are
    divided into vectors: ((1, VEC), (rows, V)). AFTER_ROUTING: this kernel is launched
    early (programmatic dependent launch) behind the routing kernel, so it loads x (which
    routing does not write) and only then waits for routing to finish before reading row_of.
    HINTS: the cache hints of the loads and stores."""
    for unit in range(first_unit, copy_unit_total(tokens, TPB, SLICES), unit_stride):
        group, column = unit_position(unit, tidx, SLICES, THREADS)
        if column < V:
            values = unit_loads(gX, tokens, group, column, VEC, TPB, HINTS)
            if cutlass.const_expr(AFTER_ROUTING):
                cute.arch.griddepcontrol_wait()
            unit_stores(gDisp, values, row_of, tokens, group, column, K, TPB, HINTS)


@cute.jit
def zero_padding_rows(gDisp: cute.Tensor, mPadStart: cute.Tensor, mPadEnd: cute.Tensor,
                      segments: Int32, tidx: Int32, first_unit: Int32, unit_stride: Int32,
                      VEC: cutlass.Constexpr[int], V: cutlass.Constexpr[int],
                      THREADS: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int]):
    """Units (padded segment, slice), grid-stride: zero the segment's padding rows there."""
    zeros = cute.make_rmem_tensor(cute.make_layout((1, VEC)), gDisp.element_type)
    zeros.fill(0)
    for unit in range(first_unit, segments * SLICES, unit_stride):
        segment, column = unit_position(unit, tidx, SLICES, THREADS)
        if column < V:
            for row in range(mPadStart[segment], mPadEnd[segment]):
                cute.autovec_copy(zeros, gDisp[(None, (row, column))])


def routing_smem(L: int):
    width = scan_width(L)
    smem = cutlass.memory.SmemAllocator()
    sCount = smem.allocate_tensor(Int32, cute.make_layout(width), byte_alignment=16)
    sBase = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sOffsets = smem.allocate_tensor(Int32, cute.make_layout(width + 1), byte_alignment=16)
    sPadStart = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sPadEnd = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sFlags = smem.allocate_tensor(Int32, cute.make_layout(SMEM_FLAGS), byte_alignment=16)
    return sCount, sBase, sOffsets, sPadStart, sPadEnd, sFlags


def ws_view(mWs: cute.Tensor, start: int, size: int) -> cute.Tensor:
    return cute.make_tensor(mWs.iterator + start, cute.make_layout(size))


def routing_chunk(pairs: Int32, bidx: Int32, BLOCKS: int) -> tuple:
    """The pairs [begin, end) routing block `bidx` of BLOCKS takes (split's and
    split_block_ranks'): contiguous chunks of chunk_pairs."""
    chunk = chunk_pairs(pairs, BLOCKS)
    begin = bidx * chunk
    return begin, cutlass.min(begin + chunk, pairs)


def chunk_pairs(pairs: Int32, BLOCKS: int) -> Int32:
    return (pairs + (BLOCKS - 1)) // BLOCKS
