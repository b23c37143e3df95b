"""moe_dispatch's fused form (decode): one cooperative kernel of `grid_blocks` blocks. Block 0
routes every pair (a slot per pair from shared-memory atomic counters, then a warp's scan of the
padded counts gives the offsets), writes counts, offsets, row_of and the list of segments that
need padding; a grid barrier; then every block copies tokens and zeroes padding rows,
grid-stride."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cutetune.kernels.moe_dispatch.common import (
    COOPERATIVE_GRID_FITS,
    DECODE_GRIDS,
    FUSED,
    FUSED_MAX_PAIRS,
    WARPS_PARAM,
    FormConfig,
    tokens_per_block_param,
)
from cutetune.spaces.space import Constraint, Param, Space


@dataclass(frozen=True)
class FusedConfig(FormConfig):
    form: ClassVar[str] = FUSED


FORM = Space(
    config_type=FusedConfig,
    params=(
        Param("grid_blocks", DECODE_GRIDS,
              "blocks of the kernel: block 0 routes, all copy (grid-stride)"),
        WARPS_PARAM,
        tokens_per_block_param(),
    ),
    constraints=(
        Constraint(
            "fused_routes_few_pairs",
            f"the fused form routes every pair in one block: at most {FUSED_MAX_PAIRS} pairs "
            "(tokens * top_k)",
            lambda p, c, d: p.num_tokens * p.top_k <= FUSED_MAX_PAIRS,
        ),
        COOPERATIVE_GRID_FITS,
    ),
)


