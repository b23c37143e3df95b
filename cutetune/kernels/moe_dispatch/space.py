"""moe_dispatch's space (its five forms and the constraints they share), the heuristic default
and the roofline cost of a point."""

from __future__ import annotations

import math

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import block_size_within_device
from cutetune.kernels.cost import Cost
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.moe_dispatch import fused, replicated, split, split_block_ranks, split_bulk
from cutetune.kernels.moe_dispatch.common import (
    BARRIER_FREE_FORMS,
    BULK_COPY_THREADS,
    MAX_LOCAL_EXPERTS,
    ROUTING_GRIDS,
    SMEM_PER_BLOCK,
    SPLIT_BLOCK_RANKS,
    SPLIT_BULK,
    SPLIT_FORMS,
    FormConfig,
    bulk_smem_bytes,
    copy_unit_total,
    expected_padding_rows,
    local_pairs,
    registers_per_thread,
    row_bytes,
    slices_of,
    smem_bytes,
    threads_of,
    vector_bits,
)
from cutetune.spaces.space import Alternatives, Constraint

SPACE = Alternatives(
    forms=(fused.FORM, replicated.FORM, split.FORM, split_bulk.FORM, split_block_ranks.FORM),
    constraints=(
        Constraint(
            "hidden_splits_into_vectors",
            "the hidden size must be a whole number of 32-bit vectors (the copy's accesses are "
            "the widest of 128, 64 and 32 bits that divides it), so every row starts on a "
            "vector boundary",
            lambda p, c, d: vector_bits(p) > 0,
        ),
        Constraint(
            "tokens_per_block_within_tokens",
            "a thread may batch at most as many tokens as the call has (more only loads the "
            "same token again)",
            lambda p, c, d: c.tokens_per_block == 1 or c.tokens_per_block <= p.num_tokens,
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
            lambda p, c, d: smem_bytes(p, c) <= SMEM_PER_BLOCK,
        ),
        block_size_within_device(),
    ),
)

# Where the default takes split_block_ranks: prefill calls of few local pairs over few local
# experts (each copy block reads the whole routing table, longer with more experts), with 3
# tokens per copy block (fewer, fuller blocks each pay that read once).
BLOCK_RANKS_DEFAULT_MAX_PAIRS = 16384
BLOCK_RANKS_DEFAULT_MAX_LOCAL_EXPERTS = 8
BLOCK_RANKS_DEFAULT_TOKENS_PER_BLOCK = 3
# split's routing grid leaves a block about this many pairs.
ROUTED_PAIRS_PER_BLOCK = 1024


def default_config(problem: MoEProblem, device) -> FormConfig:
    """Decode-sized calls (at most REPLICATED_MAX_PAIRS pairs) replicated over 128 blocks (no
    barrier, where the seed's fused form waits at one), with 4 warps per block up to 256 pairs
    and 8 beyond, as a warp ranks pairs / (32 * warps) steps. Prefill split, 8 warps per block
    (blocks of 4-8 warps reach the copy ceiling, blocks of 1 warp do not), streaming copy
    hints, and the routing grid of about ROUTED_PAIRS_PER_BLOCK pairs a block
    (default_routing_grid); narrower where the device holds fewer cooperative blocks. Before
    split, for few local experts and at most BLOCK_RANKS_DEFAULT_MAX_PAIRS local pairs,
    split_block_ranks over the narrowest routing grid with BLOCK_RANKS_DEFAULT_TOKENS_PER_BLOCK
    tokens per copy block. Where none of these fits the device, the space's first valid
    point."""
    if not vector_bits(problem):
        # No vector divides the hidden size: let the space say which constraint removed what.
        SPACE.valid_points(problem, device)
    pairs = problem.num_tokens * problem.top_k
    wide_warps = 4 if pairs <= 256 else 8
    candidates: list[FormConfig] = [replicated.ReplicatedConfig(128, warps, 1)
                                    for warps in dict.fromkeys((wide_warps, 4, 1))]
    if (local_pairs(problem) <= BLOCK_RANKS_DEFAULT_MAX_PAIRS
            and problem.local_experts <= BLOCK_RANKS_DEFAULT_MAX_LOCAL_EXPERTS):
        candidates.append(split_block_ranks.SplitBlockRanksConfig(
            ROUTING_GRIDS[0], 8, BLOCK_RANKS_DEFAULT_TOKENS_PER_BLOCK, cache_hints.STREAMING))
    grids = [blocks for blocks in ROUTING_GRIDS if blocks <= default_routing_grid(pairs)]
    candidates += [split.SplitConfig(blocks, warps, 1, cache_hints.STREAMING)
                   for blocks in reversed(grids) for warps in (8, 4, 1)]
    for config in candidates:
        if SPACE.first_violation(problem, config, device) is None:
            return config
    # An empty space raises here, saying which constraint removed how many points.
    return SPACE.valid_points(problem, device)[0]


def default_routing_grid(pairs: int) -> int:
    """The default's routing grid for a call of `pairs` pairs: the widest of the routing grids
    with at least ROUTED_PAIRS_PER_BLOCK pairs a block (the narrowest below that)."""
    fitting = [blocks for blocks in ROUTING_GRIDS if blocks * ROUTED_PAIRS_PER_BLOCK <= pairs]
    return max(fitting, default=ROUTING_GRIDS[0])


def _copy_unit_count(problem: MoEProblem, config: FormConfig) -> int:
    return copy_unit_total(problem.num_tokens, config.tokens_per_block, slices_of(problem, config))


def cost(problem: MoEProblem, config: FormConfig, device) -> Cost:
    """Bytes at DRAM: topk_ids read and row_of written once (the routing rereads its own pairs
    and the copy reads row_of back, both L2 hits), counts/offsets/error written once; x read
    once per token (every column of every token, local or not) and each local pair's row
    written once; with zero_padding, the expected padding rows (expected_padding_rows)
    written as zeros (the replicated form's blocks reread the ids from L2).
    The grid barrier's latency is not bytes: fused, split and split_bulk count one grid barrier
    (the roofline adds the measured barrier cost), and the split forms a second launch.
    split_block_ranks' copy reads the ranks back from row_of and the routing blocks' table
    (L2 hits, like split's row_of) and adds no DRAM bytes."""
    row = row_bytes(problem)
    pairs = problem.num_tokens * problem.top_k
    routing = 4 * pairs + 4 * pairs + 4 * (2 * problem.local_experts + 2)
    copy = problem.num_tokens * row + local_pairs(problem) * row
    padding = math.ceil(expected_padding_rows(problem) * row) if problem.zero_padding else 0
    one_kernel = config.form not in SPLIT_FORMS
    if one_kernel:
        blocks, threads, smem = config.grid_blocks, threads_of(config), smem_bytes(problem, config)
    elif config.form == SPLIT_BULK:
        blocks = copy_unit_total(problem.num_tokens, config.tokens_per_block, 1)
        threads, smem = BULK_COPY_THREADS, bulk_smem_bytes(problem, config)
    else:
        blocks, threads = _copy_unit_count(problem, config), threads_of(config)
        smem = smem_bytes(problem, config) if config.form == SPLIT_BLOCK_RANKS else 0
    return Cost(
        bytes_moved=routing + copy + padding,
        flops=0,
        blocks=blocks,
        threads_per_block=threads,
        registers_per_thread=registers_per_thread(problem, config),
        smem_per_block=smem,
        launches=1 if one_kernel else 2,
        grid_barriers=0 if config.form in BARRIER_FREE_FORMS else 1,
        bytes_in_flight_per_thread=(
            config.tokens_per_block * vector_bits(problem) // 8 if config.form != SPLIT_BULK
            else config.tokens_per_block * row // BULK_COPY_THREADS),
    )
