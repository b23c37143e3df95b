"""What moe_dispatch's forms share on the host: their names, the limits of the shared device
code, the workspace layout, the knobs every form has, the vector width the problem forces, and
the register and shared-memory arithmetic the constraints and the cost read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import WARP
from cutetune.kernels.cost import Cost, resident_blocks_per_sm
from cutetune.kernels.dtypes import DTYPE_BYTES, vector_elements, widest_vector_bits
from cutetune.kernels.moe_common import MoEProblem
from cutetune.spaces.space import Constraint, Param

FUSED, REPLICATED, SPLIT, SPLIT_BULK = "fused", "replicated", "split", "split_bulk"
SPLIT_BLOCK_RANKS = "split_block_ranks"
# The forms with a separate routing kernel.
SPLIT_FORMS = (SPLIT, SPLIT_BULK, SPLIT_BLOCK_RANKS)
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
# The grids of the decode forms, whose blocks also copy the tokens (fewer would leave most SMs
# idle), and the routing grids of the split forms, narrowest first (few blocks publish their
# counts cheaply).
DECODE_GRIDS = (32, 128)
ROUTING_GRIDS = (8, 32, 128)
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
# is small: at most this many words.
PUBLISHED_COUNT_WORDS = 512

# Workspace layout (int32 words). The barrier word and the epoch sit on their own 128-byte
# lines, away from the counters the routing blocks hammer with atomics.
WS_BARRIER = 0
WS_EPOCH = 32
WS_COUNTERS = 64


def ws_padding(local_experts: int) -> int:
    """Where the fused kernel's padded-segment list starts: its count, then L starts, L ends."""
    return WS_COUNTERS + 32 * math.ceil(2 * (local_experts + 1) / 32)


def ws_published(local_experts: int) -> int:
    """Where the routing blocks' published counts start (after the padded-segment list)."""
    return ws_padding(local_experts) + 1 + 2 * local_experts


def workspace_words(local_experts: int) -> int:
    return ws_published(local_experts) + PUBLISHED_COUNT_WORDS


# split_block_ranks stores a pair's rank in its routing block in row_of until the copy kernel
# resolves it: as -2 - (rank * L + local expert), below the -1 of a pair with no row. So a
# routing block's chunk of pairs times L must stay below 2^31 - 2.
RANK_CODES = 2**31 - 2


def publishes_counts(local_experts: int, routing_blocks: int) -> bool:
    """Whether split's routing blocks publish their counts (PUBLISHED_COUNT_WORDS) rather than
    add them to global counters with atomics."""
    return routing_blocks * (local_experts + 1) <= PUBLISHED_COUNT_WORDS


@dataclass(frozen=True)
class FormConfig:
    """The knobs every form has; each form's Config adds its own and names its form in the
    class attribute `form`."""

    form: ClassVar[str]
    grid_blocks: int
    warps_per_block: int
    tokens_per_block: int


WARPS_PARAM = Param("warps_per_block", (1, 4, 8), "warps in one thread block")


def tokens_per_block_param(choices: tuple[int, ...] = (1, 2, 4),
                           doc: str = "tokens whose vectors a thread loads before storing "
                                      "them (ILP of the copy)") -> Param:
    return Param("tokens_per_block", choices, doc)


def vector_bits(problem: MoEProblem) -> int:
    """The copy's bits per thread per access: the widest vector (of 128, 64, 32 bits) that
    divides the hidden size, so that every row starts on a vector boundary; a narrower one
    moves the same bytes in more, smaller accesses. 0 where none divides it."""
    return widest_vector_bits(problem.dtype, problem.hidden)


def copy_hints(config: FormConfig) -> str:
    """The cache hints of the vector copy: the config's, where its form has the knob."""
    return getattr(config, "cache_hints", cache_hints.NORMAL)


def copy_unit_total(tokens, TPB: int, SLICES: int):
    """Copy units of a call: groups of TPB tokens times the slices of a row (the kernels' and
    the cost's count, from a traced Int32 token count or an int)."""
    return (tokens + (TPB - 1)) // TPB * SLICES


def scan_width(L: int) -> int:
    """Experts the scan's lanes cover: L rounded up to a multiple of 32 (the rest count 0)."""
    return (L + WARP - 1) // WARP * WARP


def threads_of(config: FormConfig) -> int:
    return config.warps_per_block * WARP


def slices_of(problem: MoEProblem, config: FormConfig) -> int:
    """Slices of one vector per thread that cover a row."""
    vectors = problem.hidden // vector_elements(problem.dtype, vector_bits(problem))
    return math.ceil(vectors / threads_of(config))


def preloaded_units(tokens_per_block: int) -> int:
    return max(1, PRELOADED_VECTORS // tokens_per_block)


def replicated_ids_per_thread(threads: int) -> int:
    """Ids a thread of the replicated form loads before it routes: its share of the most
    pairs a block routes."""
    return (REPLICATED_MAX_PAIRS + threads - 1) // threads


def registers_per_thread(problem: MoEProblem, config: FormConfig) -> int:
    vector_registers = config.tokens_per_block * vector_bits(problem) // 32
    registers = (BASE_REGISTERS + vector_registers + config.tokens_per_block * problem.top_k)
    if config.form == REPLICATED:
        # The x vectors and the ids a thread loads before it routes.
        registers += (preloaded_units(config.tokens_per_block) * vector_registers
                      + replicated_ids_per_thread(threads_of(config)))
    return registers


def smem_bytes(problem: MoEProblem, config: FormConfig) -> int:
    # counts and offsets over the scan's width (L rounded up to 32, offsets one more), bases,
    # padded-segment starts and ends, and three flags: as routing_smem allocates them; the
    # replicated form adds each pair's local expert and rank, and each warp's counts
    # (replicated.py allocates them); split_block_ranks' copy block the routing blocks' table,
    # its prefix sums and its group's rows (split_block_ranks.py).
    L = problem.local_experts
    width = scan_width(L)
    routing = 4 * (2 * width + 1 + 3 * L + SMEM_FLAGS)
    if config.form == REPLICATED:
        return routing + 4 * (2 * REPLICATED_MAX_PAIRS + config.warps_per_block * width)
    if config.form == SPLIT_BLOCK_RANKS:
        return routing + 4 * (config.grid_blocks * (2 * L + 1)
                              + config.tokens_per_block * problem.top_k)
    return routing


def row_bytes(problem: MoEProblem) -> int:
    return problem.hidden * DTYPE_BYTES[problem.dtype]


def bulk_smem_bytes(problem: MoEProblem, config: FormConfig) -> int:
    """split_bulk's copy block: its rows and a 64-bit mbarrier per row."""
    return config.tokens_per_block * (row_bytes(problem) + 8)


def cooperative_cost(problem: MoEProblem, config: FormConfig) -> Cost:
    """The cooperative kernel's resources, for the residency checks."""
    return Cost(bytes_moved=0, flops=0, blocks=config.grid_blocks,
                threads_per_block=threads_of(config),
                registers_per_thread=registers_per_thread(problem, config),
                smem_per_block=smem_bytes(problem, config))


COOPERATIVE_GRID_FITS = Constraint(
    "cooperative_grid_fits",
    "every block of a cooperative kernel (the fused kernel, the split forms' routing) must be "
    "resident at once (SMs x blocks per SM by threads, registers and shared memory), or its "
    "grid barrier deadlocks",
    lambda p, c, d: c.grid_blocks <= (
        d.sm_count * resident_blocks_per_sm(cooperative_cost(p, c), d)),
)


def rank_code_max_tokens(problem: MoEProblem, routing_blocks: int) -> int:
    """The most tokens whose routing chunks (ceil(tokens * top_k / routing_blocks) pairs) times
    L stay below RANK_CODES."""
    return routing_blocks * ((RANK_CODES - 1) // problem.local_experts) // problem.top_k


def local_pairs(problem: MoEProblem) -> int:
    """Expected pairs routed to the local experts under uniform routing."""
    return math.ceil(problem.num_tokens * problem.top_k * problem.local_experts
                     / problem.experts)


def expected_padding_rows(problem: MoEProblem) -> float:
    """Expected padding rows under uniform routing: a non-empty segment pads (pad - 1) / 2 rows
    on average, and at most min(L, local pairs) segments are non-empty (a decode step of 8
    pairs pads 8 segments, not all 256 experts)."""
    return min(problem.local_experts, local_pairs(problem)) * (problem.pad - 1) / 2
