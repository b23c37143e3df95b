"""moe_dispatch's split_bulk form (prefill): split's routing kernel, then a copy kernel that
moves whole rows with the bulk-copy engine (cp.async.bulk): each one-warp block loads
`tokens_per_block` rows into shared memory (before it waits for routing), then one lane per k
stores each row to its k-th row of dispatched. Few instructions move many bytes, where the
vector copy issues a load and K stores per 16 bytes per thread; which is faster depends on the
shape, so the tuner chooses and the heuristic default is split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from cutlass import Int32

# The plain (non-tensor) bulk copies between global and shared memory are exposed only here.
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_global_shared_cta as bulk_store,
)
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_shared_cluster_global as bulk_load,
)

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


@cute.kernel
def bulk_copy_kernel(mX: cute.Tensor, mRowOf: cute.Tensor, mDisp: cute.Tensor,
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
