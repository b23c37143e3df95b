"""moe_dispatch's replicated form (decode): one ordinary kernel of `grid_blocks` blocks, no
barrier. Every block routes every pair itself, in shared memory, and copies its own share of the
tokens. The blocks must agree on each pair's row without talking, so the slots are not taken
with atomics (whose order differs from block to block) but ranked in pair order: warp w of W
walks the 32-pair steps w, w + W, ... in order, a pair's rank being its expert's count so far
in the warp plus the lanes before it with the same expert (one ballot per bit of the expert
id), and an exclusive scan over the warps' counts places each warp's pairs. This trades the
barrier and the global round trips of row_of for a serial walk of pairs / (32 * warps) steps,
so it is bounded to few pairs. The block's first units' x vectors are loaded before it routes
(x does not depend on routing), a row is computed from the shared-memory ranks when it is
needed, and the block that copies a token's first slice writes the token's row_of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cutetune.kernels.moe_dispatch.common import (
    DECODE_GRIDS,
    REPLICATED,
    REPLICATED_MAX_PAIRS,
    WARPS_PARAM,
    FormConfig,
    tokens_per_block_param,
)
from cutetune.spaces.space import Constraint, Param, Space


@dataclass(frozen=True)
class ReplicatedConfig(FormConfig):
    form: ClassVar[str] = REPLICATED


FORM = Space(
    config_type=ReplicatedConfig,
    params=(
        Param("grid_blocks", DECODE_GRIDS,
              "blocks of the kernel: every block routes, all copy (grid-stride)"),
        WARPS_PARAM,
        tokens_per_block_param(),
    ),
    constraints=(
        Constraint(
            "replicated_ranks_few_pairs",
            f"the replicated form ranks every pair in every block, a warp step per 32 pairs: at "
            f"most {REPLICATED_MAX_PAIRS} pairs (tokens * top_k)",
            lambda p, c, d: p.num_tokens * p.top_k <= REPLICATED_MAX_PAIRS,
        ),
    ),
)


