"""moe_dispatch's split_bulk form (prefill): split's routing kernel, then a copy kernel that
moves whole rows with the bulk-copy engine (cp.async.bulk): each one-warp block loads
`tokens_per_block` rows into shared memory (before it waits for routing), then one lane per k
stores each row to its k-th row of dispatched. Few instructions move many bytes, where the
vector copy issues a load and K stores per 16 bytes per thread; which is faster depends on the
shape, so the tuner chooses and the heuristic default is split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# The plain (non-tensor) bulk copies between global and shared memory are exposed only here.
from cutetune.kernels.moe_dispatch.common import (
    BULK_COPY_GRANULE,
    BULK_COPY_THREADS,
    COOPERATIVE_GRID_FITS,
    ROUTING_GRIDS,
    SMEM_PER_BLOCK,
    SPLIT_BULK,
    WARPS_PARAM,
    FormConfig,
    bulk_smem_bytes,
    row_bytes,
    tokens_per_block_param,
)
from cutetune.spaces.space import Constraint, Param, Space


@dataclass(frozen=True)
class SplitBulkConfig(FormConfig):
    form: ClassVar[str] = SPLIT_BULK


FORM = Space(
    config_type=SplitBulkConfig,
    params=(
        Param("grid_blocks", ROUTING_GRIDS, "blocks of the routing kernel (all route)"),
        WARPS_PARAM,
        tokens_per_block_param(doc="the rows a copy block holds in shared memory"),
    ),
    constraints=(
        Constraint(
            "bulk_rows_fit_smem",
            f"split_bulk's copy block holds tokens_per_block whole rows in shared memory: at "
            f"most {SMEM_PER_BLOCK // 1024} KiB",
            lambda p, c, d: bulk_smem_bytes(p, c) <= SMEM_PER_BLOCK,
        ),
        Constraint(
            "bulk_rows_whole_16_bytes",
            "split_bulk copies whole rows with bulk copies, which move multiples of 16 bytes "
            "between 16-byte-aligned addresses: the row must be a multiple of 16 bytes",
            lambda p, c, d: row_bytes(p) % BULK_COPY_GRANULE == 0,
        ),
        Constraint(
            "bulk_top_k_within_warp",
            f"split_bulk's copy stores a token's K rows from the K first lanes of one warp: "
            f"top_k at most {BULK_COPY_THREADS}",
            lambda p, c, d: p.top_k <= BULK_COPY_THREADS,
        ),
        COOPERATIVE_GRID_FITS,
    ),
)


