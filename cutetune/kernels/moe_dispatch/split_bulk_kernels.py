"""The kernels of moe_dispatch's split_bulk form (its config and knobs are split_bulk.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_global_shared_cta as bulk_store,
)
from cutlass.experimental.primitives.nvvm_wrapper import (
    cp_async_bulk_shared_cluster_global as bulk_load,
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
