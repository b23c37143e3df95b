"""moe_dispatch's split_block_ranks form (prefill, few experts): a routing kernel with no grid
barrier and no cooperative launch. Each block ranks its chunk's pairs in their experts
(shared-memory atomics), leaves every rank in row_of as a code (rank_code) and writes its counts
and error flag to the published table. The copy kernel (split's vector copy, launched the same
way) waits for the whole routing grid, as split's does, but then warp 0 of each block reads the
table, sums the routing blocks' bases and the offsets, and resolves its group's codes into rows:
the block of a group's first slice stores them to row_of, copy block 0 the counts, offsets and
error. Routing's latency before the copy's stores shrinks to its id loads and atomics; every
copy block pays for a read of the table, so it is bounded to small tables
(block_ranks_table_fits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cutetune.kernels import cache_hints
from cutetune.kernels.moe_dispatch.common import (
    PUBLISHED_COUNT_WORDS,
    RANK_CODES,
    ROUTING_GRIDS,
    SPLIT_BLOCK_RANKS,
    WARPS_PARAM,
    FormConfig,
    publishes_counts,
    rank_code_max_tokens,
    tokens_per_block_param,
)
from cutetune.spaces.space import Constraint, Param, Space


@dataclass(frozen=True)
class SplitBlockRanksConfig(FormConfig):
    form: ClassVar[str] = SPLIT_BLOCK_RANKS
    cache_hints: str = cache_hints.NORMAL


FORM = Space(
    config_type=SplitBlockRanksConfig,
    params=(
        Param("grid_blocks", ROUTING_GRIDS, "blocks of the routing kernel (all rank)"),
        WARPS_PARAM,
        # 3 as well: each copy block resolves its rows from the whole routing table, so fewer,
        # fuller blocks can pay off.
        tokens_per_block_param((1, 2, 3, 4)),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "block_ranks_table_fits",
            f"split_block_ranks' copy blocks each read the routing blocks' counts whole (one "
            f"warp, grid_blocks x (local experts + 1) words): at most {PUBLISHED_COUNT_WORDS} "
            f"words",
            lambda p, c, d: publishes_counts(p.local_experts, c.grid_blocks),
        ),
        Constraint(
            "block_ranks_encode",
            "split_block_ranks holds a pair's rank in its routing block in row_of as "
            "-2 - (rank * L + local expert): a routing block's pairs times the local experts "
            f"must stay below {RANK_CODES}",
            lambda p, c, d: p.num_tokens <= rank_code_max_tokens(p, c.grid_blocks),
        ),
    ),
)


