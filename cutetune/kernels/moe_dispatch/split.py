"""moe_dispatch's split form (prefill): a cooperative routing kernel of `grid_blocks` blocks,
each counting a contiguous chunk of the pairs in shared memory, then exchanging its counts with
the other blocks across a grid barrier: with few blocks and few experts it publishes them to a
table that every block then reads whole (publishes_counts), otherwise it adds them to global
per-expert counters with one atomic per expert (the returned old value is the block's base in
that expert) and reads the totals back. Every block then scans the totals itself, finishes its
pairs' rows and zeroes its share of the padding rows. A second, ordinary kernel over many
blocks copies the tokens, with the cache hints the config names; it is a programmatic
dependent launch, let go at the start of routing, so its launch and its loads of x overlap
routing, and it waits for routing only to read row_of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cutetune.kernels import cache_hints
from cutetune.kernels.moe_dispatch.common import (
    COOPERATIVE_GRID_FITS,
    ROUTING_GRIDS,
    SPLIT,
    WARPS_PARAM,
    FormConfig,
    tokens_per_block_param,
)
from cutetune.spaces.space import Param, Space


@dataclass(frozen=True)
class SplitConfig(FormConfig):
    form: ClassVar[str] = SPLIT
    cache_hints: str = cache_hints.NORMAL


FORM = Space(
    config_type=SplitConfig,
    params=(
        Param("grid_blocks", ROUTING_GRIDS, "blocks of the routing kernel (all route)"),
        WARPS_PARAM,
        tokens_per_block_param(),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(COOPERATIVE_GRID_FITS,),
)


