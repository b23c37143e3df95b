"""moe_dispatch's launcher of all five forms and its compile (launcher.py calls what it
compiles)."""

from __future__ import annotations

from dataclasses import dataclass, field

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.dtypes import vector_elements
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.moe_dispatch.common import (
    BULK_COPY_THREADS,
    FUSED,
    REPLICATED,
    SPLIT,
    SPLIT_BLOCK_RANKS,
    FormConfig,
    copy_hints,
    copy_unit_total,
    threads_of,
    vector_bits,
    workspace_words,
)
from cutetune.kernels.moe_dispatch.fused_kernels import fused_kernel
from cutetune.kernels.moe_dispatch.replicated_kernels import replicated_kernel
from cutetune.kernels.moe_dispatch.split_block_ranks_kernels import (
    block_ranks_copy_kernel,
    rank_kernel,
)
from cutetune.kernels.moe_dispatch.split_bulk_kernels import bulk_copy_kernel
from cutetune.kernels.moe_dispatch.split_kernels import copy_kernel, route_kernel


@cute.jit
def _dispatch_launch(mX: cute.Tensor, mIds: cute.Tensor, mRowOf: cute.Tensor,
                     mDisp: cute.Tensor, mCounts: cute.Tensor, mOffsets: cute.Tensor,
                     mError: cute.Tensor, mWs: cute.Tensor, stream: cuda.CUstream,
                     FORM: cutlass.Constexpr[str], K: cutlass.Constexpr[int],
                     E: cutlass.Constexpr[int], BEGIN: cutlass.Constexpr[int],
                     L: cutlass.Constexpr[int], PAD: cutlass.Constexpr[int],
                     ZERO_PAD: cutlass.Constexpr[bool], VEC: cutlass.Constexpr[int],
                     THREADS: cutlass.Constexpr[int], TPB: cutlass.Constexpr[int],
                     BLOCKS: cutlass.Constexpr[int], HINTS: cutlass.Constexpr[str]):
    V = cute.size(mX, mode=[1]) // VEC
    SLICES = (V + THREADS - 1) // THREADS
    units = copy_unit_total(cute.size(mX, mode=[0]), TPB, SLICES)
    if cutlass.const_expr(FORM == FUSED):
        fused_kernel(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, BEGIN, L,
                     PAD, ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
    elif cutlass.const_expr(FORM == REPLICATED):
        # Blocks past the copy units would only route; the padding units are known only
        # after routing, so zeroing keeps the whole grid.
        blocks = BLOCKS
        if cutlass.const_expr(not ZERO_PAD):
            blocks = cutlass.min(units, BLOCKS)
        replicated_kernel(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, K, E, BEGIN, L,
                          PAD, ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS).launch(
            grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream)
    elif cutlass.const_expr(FORM == SPLIT_BLOCK_RANKS):
        rank_kernel(mIds, mRowOf, mWs, K, E, BEGIN, L, THREADS, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream)
        # Launched early behind the routing kernel (programmatic dependent launch), as split's.
        block_ranks_copy_kernel(mX, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, L, PAD,
                                ZERO_PAD, VEC, V, THREADS, TPB, SLICES, BLOCKS, HINTS).launch(
            grid=(cutlass.max(units, 1), 1, 1), block=(THREADS, 1, 1), stream=stream,
            use_pdl=True)
    else:
        route_kernel(mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, BEGIN, L, PAD,
                     ZERO_PAD, VEC, V, THREADS, SLICES, BLOCKS).launch(
            grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=True)
        # Launched early behind the routing kernel (programmatic dependent launch): its
        # launch, first blocks and x loads overlap routing; it waits before reading row_of.
        if cutlass.const_expr(FORM == SPLIT):
            copy_kernel(mX, mRowOf, mDisp, K, VEC, V, THREADS, TPB, SLICES, HINTS).launch(
                grid=(cutlass.max(units, 1), 1, 1), block=(THREADS, 1, 1), stream=stream,
                use_pdl=True)
        else:
            # A bulk unit is TPB whole rows: one slice.
            blocks = copy_unit_total(cute.size(mX, mode=[0]), TPB, 1)
            bulk_copy_kernel(mX, mRowOf, mDisp, K, TPB).launch(
                grid=(cutlass.max(blocks, 1), 1, 1), block=(BULK_COPY_THREADS, 1, 1),
                stream=stream, use_pdl=True)


@dataclass(frozen=True, eq=False)
class FakeArguments:
    """Compile-time stand-ins for dispatch's tensors, in the order the op passes them: the token
    count and the dispatched buffer's rows are symbolic, so a compile serves every call."""

    problem: MoEProblem
    vec: int  # elements per vector of x and dispatched
    tokens: object = field(default_factory=cute.sym_int)
    rows: object = field(default_factory=cute.sym_int)

    def hidden_rows(self, count):
        return fake_rows(CUTLASS_DTYPES[self.problem.dtype], count, (self.problem.hidden,),
                         self.vec, assumed_align=16)

    def pairs(self):
        return fake_compact(cutlass.Int32, (self.tokens, self.problem.top_k), assumed_align=4)

    @staticmethod
    def ints(size: int):
        return fake_compact(cutlass.Int32, (size,), assumed_align=4)

    def op_tensors(self) -> tuple:
        """x, topk_ids, row_of, dispatched, counts, offsets, error, workspace."""
        experts = self.problem.local_experts
        return (self.hidden_rows(self.tokens), self.pairs(), self.pairs(),
                self.hidden_rows(self.rows), self.ints(experts), self.ints(experts + 1),
                self.ints(1), self.ints(workspace_words(experts)))


def compile_kernel(problem: MoEProblem, config: FormConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the token
    count (and the dispatched buffer's rows) are symbolic, so the result serves every call."""
    vec = vector_elements(problem.dtype, vector_bits(problem))
    return compile_launcher(
        _dispatch_launch, FakeArguments(problem, vec).op_tensors(),
        (config.form, problem.top_k, problem.experts, problem.expert_begin,
         problem.local_experts, problem.pad, problem.zero_padding and problem.pad > 1, vec,
         threads_of(config), config.tokens_per_block, config.grid_blocks, copy_hints(config)),
        options)
