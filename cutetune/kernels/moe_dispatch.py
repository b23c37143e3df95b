"""MoE dispatch (TP=1): route every (token, k) pair to its expert's segment and copy the tokens.

For the local experts [expert_begin, expert_end) (L of them) it writes moe_common's layout:
per-expert `counts`, padded `offsets`, the row of every pair in `row_of` (-1: not local, or an
expert id outside [0, E), which also raises `error`), and `dispatched`, the hidden states of
each expert's pairs in a segment padded to a multiple of `pad` (the padding rows zeroed when
the problem asks for zero_padding).

Five forms, chosen by the config's `policy`; each is one compiled callable on one stream:

- fused (decode): one cooperative kernel of `grid_blocks` blocks. Block 0 routes every pair
  (a slot per pair from shared-memory atomic counters, then a warp's scan of the padded counts
  gives the offsets), writes counts, offsets, row_of and the list of segments that need
  padding; a grid barrier; then every block copies tokens and zeroes padding rows, grid-stride.
- replicated (decode): one ordinary kernel of `grid_blocks` blocks, no barrier. Every block
  routes every pair itself, in shared memory, and copies its own share of the tokens. The
  blocks must agree on each pair's row without talking, so the slots are not taken with
  atomics (whose order differs from block to block) but ranked in pair order: warp w of W
  walks the 32-pair steps w, w + W, ... in order, a pair's rank being its expert's count so
  far in the warp plus the lanes before it with the same expert (one ballot per bit of the
  expert id), and an exclusive scan over the warps' counts places each warp's pairs. This
  trades the barrier and the global round trips of row_of for a serial walk of
  pairs / (32 * warps) steps, so it is bounded to few pairs. The block's first units' x
  vectors are loaded before it routes (x does not depend on routing), a row is computed from
  the shared-memory ranks when it is needed, and the block that copies a token's first slice
  writes the token's row_of.
- split (prefill): a cooperative routing kernel of `grid_blocks` blocks, each counting a
  contiguous chunk of the pairs in shared memory, then exchanging its counts with the other
  blocks across a grid barrier: with few blocks and few experts it publishes them to a table
  that every block then reads whole (publishes_counts), otherwise it adds them to global
  per-expert counters with one atomic per expert (the returned old value is the block's base
  in that expert) and reads the totals back. Every block then scans the totals itself,
  finishes its pairs' rows and zeroes its share of the padding rows. A second, ordinary kernel
  over many blocks copies the tokens, with plain or streaming (evict-first) accesses as the
  config's cache_hints says; it is a programmatic dependent launch, let go at the start of
  routing, so its launch and its loads of x overlap routing, and it waits for routing only to
  read row_of.
- split_bulk (prefill): split's routing kernel, then a copy kernel that moves whole rows with
  the bulk-copy engine (cp.async.bulk): each one-warp block loads `tokens_per_block` rows into
  shared memory (before it waits for routing), then one lane per k stores each row to its k-th
  row of dispatched. Few instructions move many bytes, where the vector copy issues a load
  and K stores per 16 bytes per thread. Which is faster depends on the shape (on the H200 the
  bulk copy wins for some presets and token counts and loses for others: BENCHMARKS.md,
  moe_dispatch at 4096 and 32768 tokens), so the tuner chooses and the heuristic default is
  split.
- split_block_ranks (prefill, few experts): a routing kernel with no grid barrier and no
  cooperative launch. Each block ranks its chunk's pairs in their experts (shared-memory
  atomics), leaves every rank in row_of as a code (_rank_code) and writes its counts and error
  flag to the published table. The copy kernel (split's vector copy, launched the same way)
  waits for the whole routing grid, as split's does, but then warp 0 of each block reads the
  table, sums the routing blocks' bases and the offsets, and resolves its group's codes into
  rows: the block of a group's first slice stores them to row_of, copy block 0 the counts,
  offsets and error. Routing's latency before the copy's stores shrinks to its id loads and
  atomics; every copy block pays for a read of the table, so it is bounded to small tables
  (block_ranks_table_fits). On the H200 it beats split for Mixtral at 1024 to 8192 tokens
  (BENCHMARKS.md, moe_dispatch: split_block_ranks).

The copy reads each token once and writes it to each of its K rows (a thread loads one vector
of `tokens_per_block` tokens, then stores each to the rows row_of names), so x is read once
per token, not once per pair. A work unit is (a group of tokens_per_block tokens, a slice of
one vector per thread across the row); padding units are (a padded segment, a slice).

Scratch lives in a persistent int32 workspace (make_inputs and the public op provide it; it is
zeroed once when allocated, never per call):
- the grid-barrier word (see `grid_barrier`: it returns to its starting state after every
  barrier, whatever the grid size, so nothing resets it between calls or between configs);
- an epoch and two sets of global per-expert counters (plus an error count), for split's
  atomic exchange. Such a call uses the set of its epoch's parity, which the previous such call
  zeroed, and zeroes the other set for the next; block 0 advances the epoch after the barrier,
  when every block has read it. Calls that publish their counts leave both alone.
- the fused kernel's list of padded segments (block 0 writes it before the barrier).
- the table of published counts (PUBLISHED_COUNT_WORDS words), rewritten whole by every call
  that publishes, and by every split_block_ranks call.
Concurrent calls must not share a workspace (the public op keeps one per device and stream).

This module is one file of about 1,750 lines because the five forms share the space, the
heuristic, the routing helpers, the workspace layout and one launcher; a package with one module
per form and one for what they share is the planned split. It changes every form's code
closure, so it waits for a session that can run every form's GPU tests and benches again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

# The plain (non-tensor) bulk copies between global and shared memory are exposed only here.
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_global_shared_cta as bulk_store,
)
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_shared_cluster_global as bulk_load,
)

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import WARP, block_size_within_device
from cutetune.kernels.cost import Cost, resident_blocks_per_sm
from cutetune.kernels.dtypes import (
    CUTLASS_DTYPES,
    DTYPE_BYTES,
    FLOAT_TOLERANCE,
    TORCH_DTYPES,
    vector_elements,
    widest_vector_bits,
)
from cutetune.kernels.moe_common import (
    MoEProblem,
    check_dispatch,
    make_routing,
    problems_for_model,
    reference_dispatch,
)
from cutetune.kernels.registry import KernelDef, Tensors, register
from cutetune.spaces.space import Constraint, Param, Space

FUSED, REPLICATED, SPLIT, SPLIT_BULK = "fused", "replicated", "split", "split_bulk"
SPLIT_BLOCK_RANKS = "split_block_ranks"
# The forms with a separate routing kernel.
SPLIT_FORMS = (SPLIT, SPLIT_BULK, SPLIT_BLOCK_RANKS)
# The forms whose copy kernel is the vector copy (and takes the cache_hints knob).
VECTOR_COPY_SPLITS = (SPLIT, SPLIT_BLOCK_RANKS)
# The forms with no grid barrier, hence no cooperative launch.
BARRIER_FREE_FORMS = (REPLICATED, SPLIT_BLOCK_RANKS)
# Block 0 of the fused kernel routes every pair alone (a few pairs per thread per step, twice:
# slot, then final row) while the other blocks wait at the barrier: bounded so that the wait
# stays short (256 tokens of top-8); beyond it the split form spreads the routing.
FUSED_MAX_PAIRS = 2048
# The replicated form keeps every pair's local expert and rank in shared memory (8 KiB here)
# and every warp ranks its share 32 pairs a step: bounded to 128 tokens of top-8.
REPLICATED_MAX_PAIRS = 1024
# x vectors a thread of the replicated form loads before it routes: those of its block's first
# 4 // tokens_per_block units (at least one), so that they land while the block routes. Four
# units cover DeepSeek-V3 at 128 tokens (1024 pairs) in 8-warp blocks: 512 units, 128 blocks.
PRELOADED_VECTORS = 4
# Expert ids (and slots) a routing thread loads before using the first: a thread's pairs cost
# one memory round trip per IDS_IN_FLIGHT, not one each.
IDS_IN_FLIGHT = 4
# Warp 0 scans the padded counts with each lane owning ceil(L / 32) consecutive experts,
# unrolled at compile time; the counters also live in shared memory.
MAX_LOCAL_EXPERTS = 1024
# The smallest routing grid: offered to split's routing kernel only (small_grid_only_routes).
ROUTING_ONLY_GRID = 8
# split's routing grids, narrowest first; the default picks the widest that leaves a block
# about this many pairs (_routing_grid).
SPLIT_GRIDS = (ROUTING_ONLY_GRID, 32, 128)
ROUTED_PAIRS_PER_BLOCK = 1024
# Shared memory a block may use without opting in (48 KiB on every CUDA GPU).
SMEM_PER_BLOCK = 48 * 1024
# split_bulk's copy: one warp per block, a lane per k issues that row's store.
BULK_COPY_THREADS = WARP
BULK_COPY_GRANULE = 16
# Shared-memory flags of a routing block: the padded segments' count, the block's error flag and
# (published counts) the errors of all blocks.
SMEM_FLAGS = 3
# A register estimate for the resource checks: addressing, loop state and the scan's lanes,
# plus each in-flight vector (in 32-bit registers) and each token's K row indices.
BASE_REGISTERS = 40

# split's routing blocks exchange their counts in one of two ways. With few blocks and few
# experts, each block publishes its L counts and its error flag with plain stores, and after the
# grid barrier reads every block's (BLOCKS * (L + 1) words) to sum the totals and its own base:
# no atomic round trip before the barrier. Otherwise each block adds its counts to global
# counters with one returning atomic per expert (its base), and reads the totals after the
# barrier. Every block reads the whole published table, so publishing pays only while the table
# is small: on the H200 it is faster than the atomics for Mixtral (L = 8) at 32768 tokens with
# 32 routing blocks (a table of 32 x 9 words), about level at smaller calls, and slower with 128
# blocks or with 128 experts and more, tables of over a thousand words (BENCHMARKS.md,
# moe_dispatch: the count exchange): hence the bound.
PUBLISHED_COUNT_WORDS = 512

# Workspace layout (int32 words). The barrier word and the epoch sit on their own 128-byte
# lines, away from the counters the routing blocks hammer with atomics.
WS_BARRIER = 0
WS_EPOCH = 32
WS_COUNTERS = 64


def _ws_padding(local_experts: int) -> int:
    """Where the fused kernel's padded-segment list starts: its count, then L starts, L ends."""
    return WS_COUNTERS + 32 * math.ceil(2 * (local_experts + 1) / 32)


def _ws_published(local_experts: int) -> int:
    """Where the routing blocks' published counts start (after the padded-segment list)."""
    return _ws_padding(local_experts) + 1 + 2 * local_experts


def workspace_words(local_experts: int) -> int:
    return _ws_published(local_experts) + PUBLISHED_COUNT_WORDS


# split_block_ranks stores a pair's rank in its routing block in row_of until the copy kernel
# resolves it: as -2 - (rank * L + local expert), below the -1 of a pair with no row. So a
# routing block's chunk of pairs times L must stay below 2^31 - 2.
RANK_CODES = 2**31 - 2
# The default takes split_block_ranks (8 routing blocks, 8 warps, streaming) for prefill calls
# of at most this many local pairs (expected under uniform routing, _local_pairs) over at most
# this many local experts: on the H200, with 2 tokens per copy block, it beats split's best
# point for Mixtral (8 experts, top-2) at 1024 to 8192 tokens (2048 to 16384 pairs) and loses
# to it at 32768, and it beats split's default for ranges of 4 and 8 of the experts of the
# top-8 presets at 4096 tokens (BENCHMARKS.md, moe_dispatch: split_block_ranks). With more
# local experts each copy block reads a longer table, which no measurement covers.
BLOCK_RANKS_DEFAULT_MAX_PAIRS = 16384
BLOCK_RANKS_DEFAULT_MAX_LOCAL_EXPERTS = 8
# A copy block of 3 tokens (split_block_ranks only): for Mixtral on the H200 (8 routing blocks,
# 8 warps) it beats 2 and 4 tokens per block at 4096 and 8192 tokens, and at 1024 it is level
# with 2 and slightly behind 4 (BENCHMARKS.md, moe_dispatch: 3 tokens per copy block), so the
# default takes it.
BLOCK_RANKS_ONLY_TOKENS_PER_BLOCK = 3


def publishes_counts(local_experts: int, routing_blocks: int) -> bool:
    """Whether split's routing blocks publish their counts (PUBLISHED_COUNT_WORDS) rather than
    add them to global counters with atomics."""
    return routing_blocks * (local_experts + 1) <= PUBLISHED_COUNT_WORDS


# ---------------------------------------------------------------------------------------------
# Config space


@dataclass(frozen=True)
class MoEDispatchConfig:
    policy: str
    grid_blocks: int
    warps_per_block: int
    vector_bits: int
    tokens_per_block: int
    cache_hints: str = cache_hints.NORMAL


def _threads(config: MoEDispatchConfig) -> int:
    return config.warps_per_block * WARP


def _slices(problem: MoEProblem, config: MoEDispatchConfig) -> int:
    """Slices of one vector per thread that cover a row."""
    vectors = problem.hidden // vector_elements(problem.dtype, config.vector_bits)
    return math.ceil(vectors / _threads(config))


def _preloaded_units(tokens_per_block: int) -> int:
    return max(1, PRELOADED_VECTORS // tokens_per_block)


def _replicated_ids_per_thread(threads: int) -> int:
    """Ids a thread of the replicated form loads before it routes: its share of the most
    pairs a block routes."""
    return (REPLICATED_MAX_PAIRS + threads - 1) // threads


def _registers_per_thread(problem: MoEProblem, config: MoEDispatchConfig) -> int:
    vector_registers = config.tokens_per_block * config.vector_bits // 32
    registers = (BASE_REGISTERS + vector_registers + config.tokens_per_block * problem.top_k)
    if config.policy == REPLICATED:
        # The x vectors and the ids a thread loads before it routes.
        registers += (_preloaded_units(config.tokens_per_block) * vector_registers
                      + _replicated_ids_per_thread(_threads(config)))
    return registers


def _smem_bytes(problem: MoEProblem, config: MoEDispatchConfig) -> int:
    # counts and offsets over the scan's width (L rounded up to 32, offsets one more), bases,
    # padded-segment starts and ends, and three flags: as _smem_tensors allocates them; the
    # replicated form adds each pair's local expert and rank, and each warp's counts
    # (_pair_tensors); split_block_ranks' copy block the routing blocks' table, its prefix
    # sums and its group's rows (_block_rank_tensors).
    L = problem.local_experts
    width = _scan_width(L)
    routing = 4 * (2 * width + 1 + 3 * L + SMEM_FLAGS)
    if config.policy == REPLICATED:
        return routing + 4 * (2 * REPLICATED_MAX_PAIRS + config.warps_per_block * width)
    if config.policy == SPLIT_BLOCK_RANKS:
        return routing + 4 * (config.grid_blocks * (2 * L + 1)
                              + config.tokens_per_block * problem.top_k)
    return routing


def _row_bytes(problem: MoEProblem) -> int:
    return problem.hidden * DTYPE_BYTES[problem.dtype]


def _bulk_smem_bytes(problem: MoEProblem, config: MoEDispatchConfig) -> int:
    """split_bulk's copy block: its rows and a 64-bit mbarrier per row."""
    return config.tokens_per_block * (_row_bytes(problem) + 8)


def _coop_cost(problem: MoEProblem, config: MoEDispatchConfig) -> Cost:
    """The cooperative kernel's resources, for the residency checks."""
    return Cost(bytes_moved=0, flops=0, blocks=config.grid_blocks,
                threads_per_block=_threads(config),
                registers_per_thread=_registers_per_thread(problem, config),
                smem_per_block=_smem_bytes(problem, config))


def _coop_grid_fits(problem: MoEProblem, config: MoEDispatchConfig, device) -> bool:
    return config.policy in BARRIER_FREE_FORMS or config.grid_blocks <= (
        device.sm_count * resident_blocks_per_sm(_coop_cost(problem, config), device))


SPACE = Space(
    config_type=MoEDispatchConfig,
    params=(
        Param("policy", (FUSED, REPLICATED, SPLIT, SPLIT_BULK, SPLIT_BLOCK_RANKS),
              "fused: one cooperative kernel (decode); replicated: one kernel, every block "
              "routes (decode); split: routing kernel + copy kernel; split_bulk: routing "
              "kernel + a copy kernel of whole rows through the bulk-copy engine; "
              "split_block_ranks: a routing kernel with no grid barrier that ranks pairs "
              "within its blocks + a copy kernel that turns those ranks into rows"),
        # The grid of the fused kernel (block 0 routes, all copy), of the replicated kernel
        # (all route, all copy) or of split's routing kernel (all route). A config constant:
        # the work is grid-stride.
        Param("grid_blocks", SPLIT_GRIDS,
              "blocks of the fused or replicated kernel, or of split's routing kernel"),
        Param("warps_per_block", (1, 4, 8), "warps in one thread block"),
        Param("vector_bits", (32, 64, 128), "bits per thread per global access of the copy"),
        Param("tokens_per_block", (1, 2, BLOCK_RANKS_ONLY_TOKENS_PER_BLOCK, 4),
              "tokens whose vectors a thread loads before storing them (ILP of the copy); "
              "split_bulk: the rows a copy block holds in shared memory"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "hidden_splits_into_vectors",
            "the hidden size must be a whole number of vectors, so every row starts on a "
            "vector boundary",
            lambda p, c, d: p.hidden % vector_elements(p.dtype, c.vector_bits) == 0,
        ),
        Constraint(
            "widest_vector",
            "the vector must be the widest (of 128, 64, 32 bits) that divides the hidden size: "
            "a narrower one moves the same bytes in more, smaller accesses",
            lambda p, c, d: c.vector_bits == widest_vector_bits(p.dtype, p.hidden),
        ),
        Constraint(
            "tokens_per_block_within_tokens",
            "a thread may batch at most as many tokens as the call has (more only loads the "
            "same token again)",
            lambda p, c, d: c.tokens_per_block == 1 or c.tokens_per_block <= p.num_tokens,
        ),
        Constraint(
            "three_tokens_per_block_block_ranks_only",
            f"{BLOCK_RANKS_ONLY_TOKENS_PER_BLOCK} tokens per block are offered to "
            "split_block_ranks only, where they were measured (its copy blocks each resolve "
            "their rows from the whole routing table, so fewer, fuller blocks pay off); the other "
            "forms were not timed there",
            lambda p, c, d: (c.tokens_per_block != BLOCK_RANKS_ONLY_TOKENS_PER_BLOCK
                             or c.policy == SPLIT_BLOCK_RANKS),
        ),
        Constraint(
            "small_grid_only_routes",
            f"{ROUTING_ONLY_GRID} blocks are offered as split's routing grid only (so few "
            "blocks publish their counts cheaply); as the grid of the fused or replicated "
            "form, which also copies the tokens, they would leave most SMs idle",
            lambda p, c, d: c.grid_blocks != ROUTING_ONLY_GRID or c.policy in SPLIT_FORMS,
        ),
        Constraint(
            "streaming_hints_split_copy_only",
            "streaming hints are offered for the split forms' vector copy, where they were "
            "measured (BENCHMARKS.md); split_bulk's bulk copies take no such hint, and the "
            "decode forms keep plain accesses",
            lambda p, c, d: (c.cache_hints == cache_hints.NORMAL
                             or c.policy in VECTOR_COPY_SPLITS),
        ),
        Constraint(
            "block_ranks_table_fits",
            f"split_block_ranks' copy blocks each read the routing blocks' counts whole (one "
            f"warp, grid_blocks x (local experts + 1) words): at most {PUBLISHED_COUNT_WORDS} "
            f"words",
            lambda p, c, d: (c.policy != SPLIT_BLOCK_RANKS
                             or publishes_counts(p.local_experts, c.grid_blocks)),
        ),
        Constraint(
            "block_ranks_encode",
            "split_block_ranks holds a pair's rank in its routing block in row_of as "
            "-2 - (rank * L + local expert): a routing block's pairs times the local experts "
            f"must stay below {RANK_CODES}",
            lambda p, c, d: (c.policy != SPLIT_BLOCK_RANKS
                             or p.num_tokens <= _rank_code_max_tokens(p, c.grid_blocks)),
        ),
        Constraint(
            "fused_routes_few_pairs",
            f"the fused form routes every pair in one block: at most {FUSED_MAX_PAIRS} pairs "
            "(tokens * top_k)",
            lambda p, c, d: c.policy != FUSED or p.num_tokens * p.top_k <= FUSED_MAX_PAIRS,
        ),
        Constraint(
            "replicated_ranks_few_pairs",
            f"the replicated form ranks every pair in every block, a warp step per 32 pairs: at "
            f"most {REPLICATED_MAX_PAIRS} pairs (tokens * top_k)",
            lambda p, c, d: (c.policy != REPLICATED
                             or p.num_tokens * p.top_k <= REPLICATED_MAX_PAIRS),
        ),
        Constraint(
            "local_experts_fit_scan",
            f"at most {MAX_LOCAL_EXPERTS} local experts: one warp scans their counts, each "
            "lane a compile-time-unrolled share",
            lambda p, c, d: p.local_experts <= MAX_LOCAL_EXPERTS,
        ),
        Constraint(
            "counters_fit_smem",
            f"the per-expert counters, offsets and segment lists must fit a block's "
            f"{SMEM_PER_BLOCK // 1024} KiB of shared memory",
            lambda p, c, d: _smem_bytes(p, c) <= SMEM_PER_BLOCK,
        ),
        Constraint(
            "bulk_rows_fit_smem",
            f"split_bulk's copy block holds tokens_per_block whole rows in shared memory: at "
            f"most {SMEM_PER_BLOCK // 1024} KiB",
            lambda p, c, d: c.policy != SPLIT_BULK or _bulk_smem_bytes(p, c) <= SMEM_PER_BLOCK,
        ),
        Constraint(
            "bulk_rows_whole_16_bytes",
            "split_bulk copies whole rows with bulk copies, which move multiples of 16 bytes "
            "between 16-byte-aligned addresses: the row must be a multiple of 16 bytes",
            lambda p, c, d: (c.policy != SPLIT_BULK
                             or _row_bytes(p) % BULK_COPY_GRANULE == 0),
        ),
        Constraint(
            "bulk_top_k_within_warp",
            f"split_bulk's copy stores a token's K rows from the K first lanes of one warp: "
            f"top_k at most {BULK_COPY_THREADS}",
            lambda p, c, d: c.policy != SPLIT_BULK or p.top_k <= BULK_COPY_THREADS,
        ),
        block_size_within_device(),
        Constraint(
            "cooperative_grid_fits",
            "every block of a cooperative kernel (fused, split's routing) must be resident at "
            "once (SMs x blocks per SM by threads, registers and shared memory), or its grid "
            "barrier deadlocks",
            _coop_grid_fits,
        ),
    ),
)


def default_config(problem: MoEProblem, device) -> MoEDispatchConfig:
    """128-bit accesses (or the widest vector that divides the hidden size). Decode-sized calls
    (at most REPLICATED_MAX_PAIRS pairs) replicated over 128 blocks: on the H200 it beats the
    seed's fused form at 1 to 128 tokens for every preset (BENCHMARKS.md, where decode
    dispatch time goes), with 4 warps per block up to 256 pairs and 8 beyond, as a warp ranks
    pairs / (32 * warps) steps. Prefill split, 8 warps per block (blocks of 4-8 warps reach
    the copy ceiling, blocks of 1 warp do not), streaming copy hints, and the routing grid of
    about ROUTED_PAIRS_PER_BLOCK pairs a block (_routing_grid); narrower where the device
    holds fewer cooperative blocks. Before split, for few local experts and at most
    BLOCK_RANKS_DEFAULT_MAX_PAIRS local pairs, split_block_ranks over 8 routing blocks with 3
    tokens per copy block. Where none of these fits the device, the space's first valid point."""
    bits = widest_vector_bits(problem.dtype, problem.hidden)
    if not bits:
        # No vector divides the hidden size: let the space say which constraint removed what.
        SPACE.valid_points(problem, device)
    pairs = problem.num_tokens * problem.top_k
    wide_warps = 4 if pairs <= 256 else 8
    candidates = [MoEDispatchConfig(REPLICATED, 128, warps, bits, 1)
                  for warps in dict.fromkeys((wide_warps, 4, 1))]
    if (_local_pairs(problem) <= BLOCK_RANKS_DEFAULT_MAX_PAIRS
            and problem.local_experts <= BLOCK_RANKS_DEFAULT_MAX_LOCAL_EXPERTS):
        candidates.append(MoEDispatchConfig(SPLIT_BLOCK_RANKS, ROUTING_ONLY_GRID, 8, bits,
                                            BLOCK_RANKS_ONLY_TOKENS_PER_BLOCK,
                                            cache_hints.STREAMING))
    grids = [blocks for blocks in SPLIT_GRIDS if blocks <= _routing_grid(pairs)]
    candidates += [MoEDispatchConfig(SPLIT, blocks, warps, bits, 1, cache_hints.STREAMING)
                   for blocks in reversed(grids) for warps in (8, 4, 1)]
    for config in candidates:
        if SPACE.first_violation(problem, config, device) is None:
            return config
    # An empty space raises here, saying which constraint removed how many points.
    return SPACE.valid_points(problem, device)[0]


def _rank_code_max_tokens(problem: MoEProblem, routing_blocks: int) -> int:
    """The most tokens whose routing chunks (ceil(tokens * top_k / routing_blocks) pairs) times
    L stay below RANK_CODES."""
    return routing_blocks * ((RANK_CODES - 1) // problem.local_experts) // problem.top_k


def _routing_grid(pairs: int) -> int:
    """The default's routing grid for a call of `pairs` pairs: the widest of the space's grids
    with at least ROUTED_PAIRS_PER_BLOCK pairs a block (the narrowest below that). On the H200
    it picks the fastest grid at every point timed (BENCHMARKS.md, moe_dispatch: the routing
    grid)."""
    fitting = [blocks for blocks in SPLIT_GRIDS if blocks * ROUTED_PAIRS_PER_BLOCK <= pairs]
    return max(fitting, default=SPLIT_GRIDS[0])


def _copy_unit_count(problem: MoEProblem, config: MoEDispatchConfig) -> int:
    return _copy_unit_total(problem.num_tokens, config.tokens_per_block, _slices(problem, config))


def expected_padding_rows(problem: MoEProblem) -> float:
    """Expected padding rows under uniform routing: a non-empty segment pads (pad - 1) / 2 rows
    on average, and at most min(L, local pairs) segments are non-empty (a decode step of 8
    pairs pads 8 segments, not all 256 experts)."""
    return min(problem.local_experts, _local_pairs(problem)) * (problem.pad - 1) / 2


def _local_pairs(problem: MoEProblem) -> int:
    """Expected pairs routed to the local experts under uniform routing."""
    return math.ceil(problem.num_tokens * problem.top_k * problem.local_experts
                     / problem.experts)


def cost(problem: MoEProblem, config: MoEDispatchConfig, device) -> Cost:
    """Bytes at DRAM: topk_ids read and row_of written once (the routing rereads its own pairs
    and the copy reads row_of back, both L2 hits), counts/offsets/error written once; x read
    once per token (every column of every token, local or not) and each local pair's row
    written once; with zero_padding, the expected padding rows (expected_padding_rows)
    written as zeros (the replicated form's blocks reread the ids from L2).
    The grid barrier's latency is not bytes: fused, split and split_bulk count one grid barrier
    (the roofline adds the measured barrier cost), and the split forms a second launch.
    split_block_ranks' copy reads the ranks back from row_of and the routing blocks' table
    (L2 hits, like split's row_of) and adds no DRAM bytes."""
    row = _row_bytes(problem)
    pairs = problem.num_tokens * problem.top_k
    routing = 4 * pairs + 4 * pairs + 4 * (2 * problem.local_experts + 2)
    copy = problem.num_tokens * row + _local_pairs(problem) * row
    padding = math.ceil(expected_padding_rows(problem) * row) if problem.zero_padding else 0
    one_kernel = config.policy not in SPLIT_FORMS
    if one_kernel:
        blocks, threads, smem = config.grid_blocks, _threads(config), _smem_bytes(problem, config)
    elif config.policy == SPLIT:
        blocks, threads, smem = _copy_unit_count(problem, config), _threads(config), 0
    elif config.policy == SPLIT_BLOCK_RANKS:
        blocks, threads = _copy_unit_count(problem, config), _threads(config)
        smem = _smem_bytes(problem, config)
    else:
        blocks = _copy_unit_total(problem.num_tokens, config.tokens_per_block, 1)
        threads, smem = BULK_COPY_THREADS, _bulk_smem_bytes(problem, config)
    return Cost(
        bytes_moved=routing + copy + padding,
        flops=0,
        blocks=blocks,
        threads_per_block=threads,
        registers_per_thread=_registers_per_thread(problem, config),
        smem_per_block=smem,
        launches=1 if one_kernel else 2,
        grid_barriers=0 if config.policy in BARRIER_FREE_FORMS else 1,
        bytes_in_flight_per_thread=(
            config.tokens_per_block * config.vector_bits // 8 if config.policy != SPLIT_BULK
            else config.tokens_per_block * row // BULK_COPY_THREADS),
    )


# ---------------------------------------------------------------------------------------------
# The grid barrier


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


# ---------------------------------------------------------------------------------------------
# Routing pieces (the id loads shared by every form; slots and rows by fused and split)


def _pair_entries(mPairs: cute.Tensor, first: Int32, stride: Int32, end: Int32,
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
def _local_expert(expert: Int32, sFlags: cute.Tensor, E: cutlass.Constexpr[int],
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
def _slot_entries(experts: list, sCount: cute.Tensor, sFlags: cute.Tensor, first: Int32,
                  end: Int32, stride: Int32, E: cutlass.Constexpr[int],
                  BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int]) -> list:
    """The slots of pairs first, first + stride, ... (their experts loaded by _pair_entries) in
    their local experts, from shared-memory atomic counters; -1 for a pair of no local expert
    or past end."""
    slots = []
    for i in cutlass.range_constexpr(len(experts)):
        slot = Int32(-1)
        if first + i * stride < end:
            local = _local_expert(experts[i], sFlags, E, BEGIN, L)
            if local >= 0:
                slot = cute.arch.atomic_add(sCount.iterator + local, Int32(1),
                                            sem="relaxed", scope="cta")
        slots.append(slot)
    return slots


@cute.jit
def _store_slot_values(experts: list, slots: list, value_of, mRowOf: cute.Tensor,
                       first: Int32, end: Int32, stride: Int32, K: cutlass.Constexpr[int]):
    """row_of of pairs first, first + stride, ... below end: value_of(slot, expert) of the
    pair's slot and expert id (its row, or split_block_ranks' _rank_code), or -1 where it has
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
def _route_pairs(mIds: cute.Tensor, mRowOf: cute.Tensor, sCount: cute.Tensor,
                 sFlags: cute.Tensor, experts: list, first: Int32, end: Int32, stride: Int32,
                 K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int]) -> list:
    """The thread's pairs first, first + stride, ... below end get a slot (_slot_entries).
    The first IDS_IN_FLIGHT, whose experts the caller loaded ahead of its own round trips,
    keep theirs in registers (returned); the rest, IDS_IN_FLIGHT at a time, store theirs in
    row_of for now."""
    slots = _slot_entries(experts, sCount, sFlags, first, end, stride, E, BEGIN, L)
    for base in range(first + IDS_IN_FLIGHT * stride, end, stride * IDS_IN_FLIGHT):
        later = _slot_entries(_pair_entries(mIds, base, stride, end, K), sCount, sFlags, base,
                              end, stride, E, BEGIN, L)
        for i in cutlass.range_constexpr(IDS_IN_FLIGHT):
            pair = base + i * stride
            if pair < end:
                token = pair // K
                mRowOf[token, pair - token * K] = later[i]
    return slots


@cute.jit
def _finish_pairs(mIds: cute.Tensor, mRowOf: cute.Tensor, sBase: cute.Tensor, experts: list,
                  slots: list, first: Int32, end: Int32, stride: Int32,
                  K: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int]):
    """row_of of _route_pairs' pairs (the same thread each): the expert's base + the slot, from
    registers for the first IDS_IN_FLIGHT, from row_of (with the ids reloaded) for the rest."""
    def row_of(slot, expert):
        return slot + sBase[expert - BEGIN]

    _store_slot_values(experts, slots, row_of, mRowOf, first, end, stride, K)
    for base in range(first + IDS_IN_FLIGHT * stride, end, stride * IDS_IN_FLIGHT):
        _store_slot_values(_pair_entries(mIds, base, stride, end, K),
                           _pair_entries(mRowOf, base, stride, end, K), row_of, mRowOf, base,
                           end, stride, K)


@cute.jit
def _scan(sTotal: cute.Tensor, sOffsets: cute.Tensor, sPadStart: cute.Tensor,
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


# ---------------------------------------------------------------------------------------------
# Copy pieces (shared by every form)


@dataclass(frozen=True)
class _StoredRows:
    """row_of(token, k) for the copy helpers: the rows routing stored in row_of (fused,
    split)."""
    mRowOf: cute.Tensor

    def __call__(self, token: Int32, k: int) -> Int32:
        return self.mRowOf[token, k]


def _copy_unit_total(tokens: Int32, TPB: int, SLICES: int) -> Int32:
    """Copy units of a call: groups of TPB tokens times the slices of a row (the kernels' and
    the cost's count, from a traced token count or an int)."""
    return (tokens + (TPB - 1)) // TPB * SLICES


def _unit_position(unit: Int32, tidx: Int32, SLICES: int, THREADS: int) -> tuple:
    """Unit u's token group (or padded segment), u // SLICES, and the thread's vector in the
    row, (u % SLICES) * THREADS + tidx."""
    group = unit // SLICES
    return group, (unit - group * SLICES) * THREADS + tidx


def _unit_loads(gX: cute.Tensor, tokens: Int32, group: Int32, column: Int32,
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
def _unit_stores(gDisp: cute.Tensor, values: list, row_of, tokens: Int32, group: Int32,
                 column: Int32, K: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                 HINTS: cutlass.Constexpr[str] = cache_hints.NORMAL):
    """Store _unit_loads' vectors to each of their tokens' rows, row_of(token, k) (skipped
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
def _copy_units(gX: cute.Tensor, row_of, gDisp: cute.Tensor, tokens: Int32, tidx: Int32,
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
    for unit in range(first_unit, _copy_unit_total(tokens, TPB, SLICES), unit_stride):
        group, column = _unit_position(unit, tidx, SLICES, THREADS)
        if column < V:
            values = _unit_loads(gX, tokens, group, column, VEC, TPB, HINTS)
            if cutlass.const_expr(AFTER_ROUTING):
                cute.arch.griddepcontrol_wait()
            _unit_stores(gDisp, values, row_of, tokens, group, column, K, TPB, HINTS)


@cute.jit
def _zero_padding(gDisp: cute.Tensor, mPadStart: cute.Tensor, mPadEnd: cute.Tensor,
                  segments: Int32, tidx: Int32, first_unit: Int32, unit_stride: Int32,
                  VEC: cutlass.Constexpr[int], V: cutlass.Constexpr[int],
                  THREADS: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int]):
    """Units (padded segment, slice), grid-stride: zero the segment's padding rows there."""
    zeros = cute.make_rmem_tensor(cute.make_layout((1, VEC)), gDisp.element_type)
    zeros.fill(0)
    for unit in range(first_unit, segments * SLICES, unit_stride):
        segment, column = _unit_position(unit, tidx, SLICES, THREADS)
        if column < V:
            for row in range(mPadStart[segment], mPadEnd[segment]):
                cute.autovec_copy(zeros, gDisp[(None, (row, column))])


def _scan_width(L: int) -> int:
    """Experts the scan's lanes cover: L rounded up to a multiple of 32 (the rest count 0)."""
    return (L + WARP - 1) // WARP * WARP


def _smem_tensors(L: int):
    width = _scan_width(L)
    smem = cutlass.memory.SmemAllocator()
    sCount = smem.allocate_tensor(Int32, cute.make_layout(width), byte_alignment=16)
    sBase = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sOffsets = smem.allocate_tensor(Int32, cute.make_layout(width + 1), byte_alignment=16)
    sPadStart = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sPadEnd = smem.allocate_tensor(Int32, cute.make_layout(L), byte_alignment=16)
    sFlags = smem.allocate_tensor(Int32, cute.make_layout(SMEM_FLAGS), byte_alignment=16)
    return sCount, sBase, sOffsets, sPadStart, sPadEnd, sFlags


def _pair_tensors(warps: int, L: int):
    """The replicated form's per-pair local expert and rank, and each warp's per-expert counts
    (allocated after _smem_tensors)."""
    smem = cutlass.memory.SmemAllocator()
    sLocal = smem.allocate_tensor(Int32, cute.make_layout(REPLICATED_MAX_PAIRS),
                                  byte_alignment=16)
    sRank = smem.allocate_tensor(Int32, cute.make_layout(REPLICATED_MAX_PAIRS),
                                 byte_alignment=16)
    sHist = smem.allocate_tensor(Int32, cute.make_layout(warps * _scan_width(L)),
                                 byte_alignment=16)
    return sLocal, sRank, sHist


def _ws_view(mWs: cute.Tensor, start: int, size: int) -> cute.Tensor:
    return cute.make_tensor(mWs.iterator + start, cute.make_layout(size))


# ---------------------------------------------------------------------------------------------
# The kernels


@cute.kernel
def _fused_kernel(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
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
    sCount, _, sOffsets, sPadStart, sPadEnd, sFlags = _smem_tensors(L)
    pad_list = _ws_padding(L)
    mPadStart = _ws_view(mWs, pad_list + 1, L)
    mPadEnd = _ws_view(mWs, pad_list + 1 + L, L)
    pairs = cute.size(mIds, mode=[0]) * K
    if bidx == 0:
        # The first ids are loaded before anything waits on memory or on the block.
        experts = _pair_entries(mIds, tidx, THREADS, pairs, K)
        for e in range(tidx, _scan_width(L), THREADS):
            sCount[e] = 0
        if tidx == 0:
            sFlags[1] = 0
        cute.arch.sync_threads()
        slots = _route_pairs(mIds, mRowOf, sCount, sFlags, experts, tidx, pairs, THREADS, K, E,
                             BEGIN, L)
        cute.arch.sync_threads()
        if tidx < WARP:
            _scan(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
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
        _finish_pairs(mIds, mRowOf, sOffsets, experts, slots, tidx, pairs, THREADS, K, BEGIN)
    grid_barrier(mWs, tidx, bidx, BLOCKS)
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    _copy_units(gX, _StoredRows(mRowOf), gDisp, cute.size(mRowOf, mode=[0]), tidx,
                bidx, BLOCKS, K, VEC, V, THREADS, TPB, SLICES, False, cache_hints.NORMAL)
    if cutlass.const_expr(ZERO_PAD):
        _zero_padding(gDisp, mPadStart, mPadEnd, mWs[pad_list], tidx, bidx, BLOCKS, VEC, V,
                      THREADS, SLICES)


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
def _replicated_kernel(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor,
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
    WIDTH = _scan_width(L)
    sCount, _, sOffsets, sPadStart, sPadEnd, sFlags = _smem_tensors(L)
    sLocal, sRank, sHist = _pair_tensors(WARPS, L)
    tokens = cute.size(mIds, mode=[0])
    pairs = tokens * K
    units = _copy_unit_total(tokens, TPB, SLICES)
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    # x does not depend on routing: the block's first units' vectors are loaded now and land
    # while it routes. A unit this block does not have loads its first unit again.
    PRELOADED_UNITS = _preloaded_units(TPB)
    preloaded = []
    for i in cutlass.range_constexpr(PRELOADED_UNITS):
        unit = bidx + i * BLOCKS * Int32(bidx + i * BLOCKS < units)
        group, column = _unit_position(unit, tidx, SLICES, THREADS)
        preloaded.append(_unit_loads(gX, tokens, group, cutlass.min(column, V - 1), VEC, TPB))
    # Every id the thread routes (a block routes at most REPLICATED_MAX_PAIRS pairs), loaded
    # before the barrier too, so that their round trip overlaps x's and the barrier's.
    IDS_PER_THREAD = _replicated_ids_per_thread(THREADS)
    experts = _pair_entries(mIds, tidx, THREADS, pairs, K, IDS_PER_THREAD)
    for i in range(tidx, WARPS * WIDTH, THREADS):
        sHist[i] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()  # the error flag is cleared before any thread raises it
    for i in cutlass.range_constexpr(IDS_PER_THREAD):
        pair = tidx + i * THREADS
        if pair < pairs:
            sLocal[pair] = _local_expert(experts[i], sFlags, E, BEGIN, L)
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
        _scan(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
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
        group, column = _unit_position(unit, tidx, SLICES, THREADS)
        if unit < units and column < V:
            _unit_stores(gDisp, preloaded[i], row_of, tokens, group, column, K, TPB)
    _copy_units(gX, row_of, gDisp, tokens, tidx, bidx + PRELOADED_UNITS * BLOCKS, BLOCKS, K,
                VEC, V, THREADS, TPB, SLICES, False, cache_hints.NORMAL)
    if cutlass.const_expr(ZERO_PAD):
        _zero_padding(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, BLOCKS, VEC, V, THREADS,
                      SLICES)


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
    mTable = _publish_row(mWs, sCount, sFlags, tidx, bidx, L, THREADS, BLOCKS)
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
def _publish_row(mWs: cute.Tensor, sCount: cute.Tensor, sFlags: cute.Tensor, tidx: Int32,
                 bidx: Int32, L: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                 BLOCKS: cutlass.Constexpr[int]) -> cute.Tensor:
    """Row bidx of the published (BLOCKS, L + 1) table: the block's L counts and its error
    flag (sFlags[1]), with plain stores. Returns the table."""
    ROW = L + 1
    mTable = _ws_view(mWs, _ws_published(L), BLOCKS * ROW)
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
    sCount, sBase, sOffsets, sPadStart, sPadEnd, sFlags = _smem_tensors(L)
    begin, end = _routing_chunk(cute.size(mIds, mode=[0]) * K, bidx, BLOCKS)
    # The thread's first ids are loaded first, so that their round trip overlaps the epoch's
    # in the atomic exchange (the stores below depend on the epoch, and no load can be moved
    # above them).
    experts = _pair_entries(mIds, begin + tidx, THREADS, end, K)
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
    for e in range(tidx, _scan_width(L), THREADS):
        sCount[e] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()
    slots = _route_pairs(mIds, mRowOf, sCount, sFlags, experts, begin + tidx, end, THREADS, K,
                         E, BEGIN, L)
    cute.arch.sync_threads()
    if cutlass.const_expr(PUBLISH):
        _publish_counts(mWs, sCount, sBase, sFlags, tidx, bidx, L, THREADS, BLOCKS)
    else:
        _add_counts(mWs, mTotals, sCount, sBase, sFlags, tidx, bidx, L, THREADS, BLOCKS)
    cute.arch.sync_threads()
    if tidx < WARP:
        _scan(sCount, sOffsets, sPadStart, sPadEnd, sFlags, tidx, L, PAD, ZERO_PAD)
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
    _finish_pairs(mIds, mRowOf, sBase, experts, slots, begin + tidx, end, THREADS, K, BEGIN)
    return sPadStart, sPadEnd, sFlags


@cute.kernel
def _route_kernel(mIds: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
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
        _zero_padding(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, BLOCKS, VEC, V, THREADS,
                      SLICES)


@cute.kernel
def _copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                 K: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
                 V: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                 TPB: cutlass.Constexpr[int], SLICES: cutlass.Constexpr[int],
                 HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    gX = cute.zipped_divide(mX, (1, VEC))
    gDisp = cute.zipped_divide(mDisp, (1, VEC))
    _copy_units(gX, _StoredRows(mRowOf), gDisp, cute.size(mRowOf, mode=[0]), tidx,
                bidx, gdim, K, VEC, V, THREADS, TPB, SLICES, True, HINTS)


@cute.kernel
def _bulk_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
                      K: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int]):
    """Tokens bidx * TPB + [0, TPB), one warp: lane 0 loads each token's row into shared
    memory with a bulk copy (its own mbarrier), before waiting for routing; then lane k < K
    stores each row to its k-th row of dispatched with a bulk copy, and the block waits until
    those stores have read shared memory."""
    lane, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    HIDDEN = cute.size(mX, mode=[1])
    ROW_BYTES = HIDDEN * mX.element_type.width // 8
    smem = cutlass.memory.SmemAllocator()
    sRows = smem.allocate_tensor(mX.element_type,
                                 cute.make_layout((TPB, HIDDEN), stride=(HIDDEN, 1)),
                                 byte_alignment=128)
    sLoaded = smem.allocate_tensor(cutlass.Int64, cute.make_layout(TPB), byte_alignment=8)
    tokens = cute.size(mX, mode=[0])
    first = bidx * TPB
    if lane == 0:
        for i in cutlass.range_constexpr(TPB):
            cute.arch.mbarrier_init(sLoaded.iterator + i, 1)
        cute.arch.mbarrier_init_fence()
        for i in cutlass.range_constexpr(TPB):
            if first + i < tokens:
                cute.arch.mbarrier_arrive_and_expect_tx(sLoaded.iterator + i, ROW_BYTES)
                bulk_load(sRows[i, None].iterator, mX[first + i, None].iterator,
                          sLoaded.iterator + i, ROW_BYTES)
    # Every lane waits on the mbarriers below: lane 0 must have initialised them.
    cute.arch.sync_warp()
    cute.arch.griddepcontrol_wait()
    rows = []
    for i in cutlass.range_constexpr(TPB):
        row = Int32(-1)
        if lane < K and first + i < tokens:
            row = mRowOf[first + i, lane]
        rows.append(row)
    for i in cutlass.range_constexpr(TPB):
        if first + i < tokens:
            cute.arch.mbarrier_wait(sLoaded.iterator + i, 0)
            if rows[i] >= 0:
                bulk_store(mDisp[rows[i], None].iterator, sRows[i, None].iterator, ROW_BYTES)
    cute.arch.cp_async_bulk_commit_group()
    # Shared memory must outlive the stores' reads of it.
    cute.arch.cp_async_bulk_wait_group(0, read=True)


@cute.kernel
def _rank_kernel(mIds: cute.Tensor, mRowOf: cute.Tensor, mWs: cute.Tensor,
                 K: cutlass.Constexpr[int], E: cutlass.Constexpr[int],
                 BEGIN: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
                 THREADS: cutlass.Constexpr[int], BLOCKS: cutlass.Constexpr[int]):
    """split_block_ranks' routing: block `bidx` ranks the pairs of its contiguous chunk in their
    local experts (shared-memory atomics), stores each pair's rank in row_of as
    _rank_code, and its L counts and its error flag to row bidx of the published table
    (_ws_published). No block waits for another: the copy kernel's dependent-launch wait, for
    this whole grid, is the only barrier, and that kernel resolves the ranks into rows."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    # The copy kernel may launch now: it loads x, then waits for this grid to finish.
    cute.arch.griddepcontrol_launch_dependents()
    sCount, _, _, _, _, sFlags = _smem_tensors(L)
    begin, end = _routing_chunk(cute.size(mIds, mode=[0]) * K, bidx, BLOCKS)
    first = begin + tidx
    experts = _pair_entries(mIds, first, THREADS, end, K)
    for e in range(tidx, L, THREADS):
        sCount[e] = 0
    if tidx == 0:
        sFlags[1] = 0
    cute.arch.sync_threads()

    def code_of(slot, expert):
        return _rank_code(slot, expert - BEGIN, L)

    _store_slot_values(experts, _slot_entries(experts, sCount, sFlags, first, end, THREADS, E,
                                              BEGIN, L),
                       code_of, mRowOf, first, end, THREADS, K)
    for base in range(first + IDS_IN_FLIGHT * THREADS, end, IDS_IN_FLIGHT * THREADS):
        later = _pair_entries(mIds, base, THREADS, end, K)
        _store_slot_values(later, _slot_entries(later, sCount, sFlags, base, end, THREADS, E,
                                                BEGIN, L),
                           code_of, mRowOf, base, end, THREADS, K)
    cute.arch.sync_threads()
    _publish_row(mWs, sCount, sFlags, tidx, bidx, L, THREADS, BLOCKS)


def _rank_code(rank: Int32, local: Int32, L: int) -> Int32:
    """A pair's rank in its routing block and its local expert, as split_block_ranks' routing
    leaves them in row_of: -2 - (rank * L + local), below any row and the -1 of no row."""
    return -2 - (rank * L + local)


def _rank_of_code(code: Int32, L: int) -> tuple:
    """_rank_code's (rank, local expert) back from a code below -1."""
    value = -2 - code
    rank = value // L
    return rank, value - rank * L


def _routing_chunk(pairs: Int32, bidx: Int32, BLOCKS: int) -> tuple:
    """The pairs [begin, end) routing block `bidx` of BLOCKS takes (split's and
    split_block_ranks'): contiguous chunks of _chunk_pairs."""
    chunk = _chunk_pairs(pairs, BLOCKS)
    begin = bidx * chunk
    return begin, cutlass.min(begin + chunk, pairs)


def _chunk_pairs(pairs: Int32, BLOCKS: int) -> Int32:
    return (pairs + (BLOCKS - 1)) // BLOCKS


def _block_rank_tensors(L: int, BLOCKS: int, PAIRS: int):
    """A split_block_ranks copy block's routing table, each routing block's base in each expert
    and its group's PAIRS rows (allocated after _smem_tensors)."""
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
    smem_tensors and rank_tensors: as _smem_tensors and _block_rank_tensors allocate them."""
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
    mTable = _ws_view(mWs, _ws_published(L), WORDS)
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
    for e in cutlass.range_constexpr((max(_scan_width(L), L + 1) + WARP - 1) // WARP):
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
        if expert < _scan_width(L):
            sCount[expert] = total * Int32(expert < L)
    cute.arch.sync_warp()
    _scan(sCount, sOffsets, sPadStart, sPadEnd, sFlags, lane, L, PAD, ZERO_PAD)
    cute.arch.sync_warp()
    for j in cutlass.range_constexpr((GROUP_PAIRS + WARP - 1) // WARP):
        index = lane + j * WARP
        pair = group * GROUP_PAIRS + index
        if index < GROUP_PAIRS and pair < pairs:
            row = codes[j]
            if row < -1:
                rank, local = _rank_of_code(row, L)
                block = pair // _chunk_pairs(pairs, BLOCKS)
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
def _block_ranks_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
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
    group, column = _unit_position(bidx, tidx, SLICES, THREADS)
    values = _unit_loads(gX, tokens, group, cutlass.min(column, V - 1), VEC, TPB, HINTS)
    smem_tensors = _smem_tensors(L)
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
        _unit_stores(gDisp, values, _GroupRows(sRows, group, K, TPB), tokens, group, column, K,
                     TPB, HINTS)
    if cutlass.const_expr(ZERO_PAD):
        _zero_padding(gDisp, sPadStart, sPadEnd, sFlags[0], tidx, bidx, gdim, VEC, V, THREADS,
                      SLICES)


@cute.jit
def _dispatch_launch(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor,
                     mDisp: cute.Tensor, mCounts: cute.Tensor, mOffsets: cute.Tensor,
                     mError: cute.Tensor, mWs: cute.Tensor, stream: cuda.CUstream,
                     POLICY: cutlass.Constexpr[str], K: cutlass.Constexpr[int],
                     E: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int],
                     L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                     ZERO_PAD: cutlass.Constexpr[bool], VEC: cutlass.Constexpr[int],
                     THREADS: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                     BLOCKS: cutlass.Constexpr[int], HINTS: cutlass.Constexpr[str]):
    V = cute.size(mX, mode=[1]) // VEC
    SLICES = (V + THREADS - 1) // THREADS
    units = _copy_unit_total(cute.size(mX, mode=[0]), TPB, SLICES)
    if cutlass.const_expr(POLICY == FUSED):
        _fused_kernel(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, BEGIN, L,
                      PAD, ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
    elif cutlass.const_expr(POLICY == REPLICATED):
        # Blocks past the copy units would only route; the padding units are known only
        # after routing, so zeroing keeps the whole grid.
        blocks = BLOCKS
        if cutlass.const_expr(not ZERO_PAD):
            blocks = cutlass.min(units, BLOCKS)
        _replicated_kernel(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, K, E, BEGIN, L,
                           PAD, ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS).launch(
            grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream)
    elif cutlass.const_expr(POLICY == SPLIT_BLOCK_RANKS):
        _rank_kernel(mIds, mRowOf, mWs, K, E, BEGIN, L, THREADS, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream)
        # Launched early behind the routing kernel (programmatic dependent launch), as split's.
        _block_ranks_copy_kernel(mX, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, L, PAD,
                                 ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS, HINTS).launch(
            grid=(cutlass.max(units, 1), 1, 1), block=(THREADS, 1, 1), stream=stream,
            use_pdl=True)
    else:
        _route_kernel(mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, BEGIN, L, PAD,
                      ZERO_PAD, VEC, V, THREADS, SLICES, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
        # Launched early behind the routing kernel (programmatic dependent launch): its
        # launch, first blocks and x loads overlap routing; it waits before reading row_of.
        if cutlass.const_expr(POLICY == SPLIT):
            _copy_kernel(mX, mRowOf, mDisp, K, VEC, V, THREADS, TPB, SLICES, HINTS).launch(
                grid=(cutlass.max(units, 1), 1, 1), block=(THREADS, 1, 1), stream=stream,
                use_pdl=True)
        else:
            # A bulk unit is TPB whole rows: one slice.
            blocks = _copy_unit_total(cute.size(mX, mode=[0]), TPB, 1)
            _bulk_copy_kernel(mX, mRowOf, mDisp, K, TPB).launch(
                grid=(cutlass.max(blocks, 1), 1, 1), block=(BULK_COPY_THREADS, 1, 1),
                stream=stream, use_pdl=True)


# ---------------------------------------------------------------------------------------------
# Compile, the residency check, launch


# torch does not report the blocks an SM holds: 16 is the least of any GPU since Volta (Hopper
# and Blackwell hold 32), so the check may only err on the safe side.
MIN_BLOCKS_PER_SM = 16


class CooperativeGridError(RuntimeError):
    """A cooperative grid larger than the device can hold at once (its barrier would hang)."""


def resident_capacity(threads_per_block: int, registers_per_thread: int, smem_per_block: int,
                      props) -> int:
    """Blocks of this shape the device holds at once: SMs x blocks per SM by threads, registers
    and shared memory. `props` as torch.cuda.get_device_properties returns (fields
    multi_processor_count, max_threads_per_multi_processor, regs_per_multiprocessor and, where
    present, shared_memory_per_multiprocessor and max_blocks_per_multi_processor)."""
    by_threads = props.max_threads_per_multi_processor // threads_per_block
    by_registers = props.regs_per_multiprocessor // (registers_per_thread * threads_per_block)
    by_blocks = getattr(props, "max_blocks_per_multi_processor", MIN_BLOCKS_PER_SM)
    per_sm = min(by_threads, by_registers, by_blocks)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    if smem_per_block and smem_per_sm:
        per_sm = min(per_sm, smem_per_sm // smem_per_block)
    return props.multi_processor_count * per_sm


def check_cooperative_grid(blocks: int, threads_per_block: int, registers_per_thread: int,
                           smem_per_block: int, props) -> None:
    """Raise CooperativeGridError, before anything launches, when `blocks` cannot all be
    resident at once on the device `props` describes."""
    capacity = resident_capacity(threads_per_block, registers_per_thread, smem_per_block, props)
    if blocks > capacity:
        name = getattr(props, "name", "this device")
        raise CooperativeGridError(
            f"moe_dispatch: a cooperative grid of {blocks} blocks of {threads_per_block} threads "
            f"does not fit {name}, which holds {capacity} at once "
            f"({props.multi_processor_count} SMs); use a config with grid_blocks <= {capacity}")


class CompiledDispatch:
    """The compiled launcher plus what the launch path needs to check its cooperative grid;
    called with (x, topk_ids, row_of, dispatched, counts, offsets, error, workspace)."""

    def __init__(self, problem: MoEProblem, config: MoEDispatchConfig, fn):
        self.fn = fn
        self.problem = problem
        self.config = config
        self._checked_devices: set[int] = set()
        # split_block_ranks' codes bound the tokens of a call (block_ranks_encode).
        self._max_tokens = (_rank_code_max_tokens(problem, config.grid_blocks)
                            if config.policy == SPLIT_BLOCK_RANKS else None)

    def check_device(self, device: int) -> None:
        if device in self._checked_devices or self.config.policy in BARRIER_FREE_FORMS:
            return
        cost = _coop_cost(self.problem, self.config)
        check_cooperative_grid(cost.blocks, cost.threads_per_block, cost.registers_per_thread,
                               cost.smem_per_block, torch.cuda.get_device_properties(device))
        self._checked_devices.add(device)

    def __call__(self, x, topk_ids, row_of, dispatched, counts, offsets, error, workspace):
        self.check_device(x.get_device())
        if self._max_tokens is not None and x.shape[0] > self._max_tokens:
            raise ValueError(
                f"moe_dispatch: {x.shape[0]} tokens are too many for split_block_ranks over "
                f"{self.config.grid_blocks} routing blocks (a block's pairs times the "
                f"{self.problem.local_experts} local experts must stay below {RANK_CODES}); "
                "use more routing blocks or another policy")
        self.fn(x, topk_ids, row_of, dispatched, counts, offsets, error, workspace)


@dataclass(frozen=True, eq=False)
class FakeArguments:
    """Compile-time stand-ins for dispatch's tensors, in the order the op passes them: the token
    count and the dispatched buffer's rows are symbolic, so a compile serves every call."""

    problem: MoEProblem
    vec: int  # elements per vector of x and dispatched
    tokens: object = field(default_factory=cute.sym_int)
    rows: object = field(default_factory=cute.sym_int)

    def hidden_rows(self, count):
        # A 64-bit row stride keeps row * hidden from overflowing 32 bits in big buffers.
        return cute.runtime.make_fake_tensor(CUTLASS_DTYPES[self.problem.dtype],
                                             (count, self.problem.hidden),
                                             (cute.sym_int64(divisibility=self.vec), 1),
                                             assumed_align=16)

    def pairs(self):
        # Row-major, as torch holds (tokens, top_k); a compact fake tensor would be
        # column-major (CuTe's default mode order).
        return cute.runtime.make_fake_tensor(cutlass.Int32, (self.tokens, self.problem.top_k),
                                             (self.problem.top_k, 1), assumed_align=4)

    @staticmethod
    def ints(size: int):
        return cute.runtime.make_fake_tensor(cutlass.Int32, (size,), (1,), assumed_align=4)

    def op_tensors(self) -> tuple:
        """x, topk_ids, row_of, dispatched, counts, offsets, error, workspace."""
        experts = self.problem.local_experts
        return (self.hidden_rows(self.tokens), self.pairs(), self.pairs(),
                self.hidden_rows(self.rows), self.ints(experts), self.ints(experts + 1),
                self.ints(1), self.ints(workspace_words(experts)))


def compile_kernel(problem: MoEProblem, config: MoEDispatchConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the token
    count (and the dispatched buffer's rows) are symbolic, so the result serves every call."""
    vec = vector_elements(problem.dtype, config.vector_bits)
    L = problem.local_experts
    return cute.compile(
        _dispatch_launch,
        *FakeArguments(problem, vec).op_tensors(),
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
        config.policy, problem.top_k, problem.experts, problem.expert_begin, L,
        problem.pad, problem.zero_padding and problem.pad > 1, vec, _threads(config),
        config.tokens_per_block, config.grid_blocks, config.cache_hints,
        options=" ".join(("--enable-tvm-ffi", options)).strip(),
    )


def launch(compiled: CompiledDispatch, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["topk_ids"], tensors["row_of"], tensors["dispatched"],
             tensors["counts"], tensors["offsets"], tensors["error"], tensors["workspace"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs


def new_workspace(problem: MoEProblem, device) -> torch.Tensor:
    """Zeroed once here; the kernels keep it consistent from call to call."""
    return torch.zeros(workspace_words(problem.local_experts), dtype=torch.int32, device=device)


def make_inputs(problem: MoEProblem, device, generator: torch.Generator) -> Tensors:
    """x random, uniform routing, the outputs allocated (the verifier poisons them) and a
    workspace."""
    dtype = TORCH_DTYPES[problem.dtype]
    x = torch.randn(problem.num_tokens, problem.hidden, generator=generator, device=device,
                    dtype=torch.float32).to(dtype)
    topk_ids, _ = make_routing(problem, device, generator)
    L = problem.local_experts
    return {
        "x": x,
        "topk_ids": topk_ids,
        "counts": torch.empty(L, dtype=torch.int32, device=device),
        "offsets": torch.empty(L + 1, dtype=torch.int32, device=device),
        "row_of": torch.empty(problem.num_tokens, problem.top_k, dtype=torch.int32,
                              device=device),
        "dispatched": torch.empty(problem.capacity, problem.hidden, dtype=dtype, device=device),
        "error": torch.empty(1, dtype=torch.int32, device=device),
        "workspace": new_workspace(problem, device),
    }


def reference(tensors: Tensors, problem: MoEProblem) -> dict[str, torch.Tensor]:
    """moe_common's torch reference: a stable sort of the pairs by expert, index_copy."""
    return reference_dispatch(tensors["x"], tensors["topk_ids"], problem)


KERNEL = register(KernelDef(
    name="moe_dispatch",
    description="MoE dispatch (TP=1): route (token, k) pairs to padded per-expert segments "
                "and copy the tokens there",
    problem_type=MoEProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=compile_kernel,
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("counts", "offsets", "row_of", "dispatched", "error"),
    written_in_place=(),
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    check=check_dispatch,
    bind=CompiledDispatch,
))
