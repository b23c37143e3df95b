"""Compile and launch moe_dispatch: one launcher traced per form (its kernels on one stream),
compiled from fake tensors, and the check that a cooperative grid fits the device before it
launches."""

from __future__ import annotations

from dataclasses import dataclass, field

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from cutetune.kernels.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.dtypes import CUTLASS_DTYPES, vector_elements
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.moe_dispatch.common import (
    BARRIER_FREE_FORMS,
    BULK_COPY_THREADS,
    FUSED,
    RANK_CODES,
    REPLICATED,
    SPLIT,
    SPLIT_BLOCK_RANKS,
    FormConfig,
    cooperative_cost,
    copy_hints,
    copy_unit_total,
    rank_code_max_tokens,
    threads_of,
    vector_bits,
    workspace_words,
)
from cutetune.kernels.moe_dispatch.fused import fused_kernel
from cutetune.kernels.moe_dispatch.replicated import replicated_kernel
from cutetune.kernels.moe_dispatch.split import copy_kernel, route_kernel
from cutetune.kernels.moe_dispatch.split_block_ranks import block_ranks_copy_kernel, rank_kernel
from cutetune.kernels.moe_dispatch.split_bulk import bulk_copy_kernel
from cutetune.kernels.registry import Tensors


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


# torch does not report the blocks an SM holds: 16 is the least of any GPU since Volta (Hopper
# and Blackwell hold 32), so the check may only err on the safe side.
MIN_BLOCKS_PER_SM = 16


class CooperativeGridError(RuntimeError):
    """A cooperative grid larger than the device can hold at once (its barrier would hang)."""


def resident_capacity(threads_per_block: int, registers_per_thread: int, smem_per_block: int,
                      props) -> int:
    """Blocks of this shape the device holds at once: SMs x blocks per SM by threads, registers
    and shared memory. `props` as torch.cuda.get_device_properties returns (fields
    multi_processor_count, max_threads_per_multi_processor, regs_per_multiprocessor and, where
    present, shared_memory_per_multiprocessor and max_blocks_per_multi_processor)."""
    by_threads = props.max_threads_per_multi_processor // threads_per_block
    by_registers = props.regs_per_multiprocessor // (registers_per_thread * threads_per_block)
    by_blocks = getattr(props, "max_blocks_per_multi_processor", MIN_BLOCKS_PER_SM)
    per_sm = min(by_threads, by_registers, by_blocks)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    if smem_per_block and smem_per_sm:
        per_sm = min(per_sm, smem_per_sm // smem_per_block)
    return props.multi_processor_count * per_sm


def check_cooperative_grid(blocks: int, threads_per_block: int, registers_per_thread: int,
                           smem_per_block: int, props) -> None:
    """Raise CooperativeGridError, before anything launches, when `blocks` cannot all be
    resident at once on the device `props` describes."""
    capacity = resident_capacity(threads_per_block, registers_per_thread, smem_per_block, props)
    if blocks > capacity:
        name = getattr(props, "name", "this device")
        raise CooperativeGridError(
            f"moe_dispatch: a cooperative grid of {blocks} blocks of {threads_per_block} threads "
            f"does not fit {name}, which holds {capacity} at once "
            f"({props.multi_processor_count} SMs); use a config with grid_blocks <= {capacity}")


class CompiledDispatch:
    """The compiled launcher plus what the launch path needs to check its cooperative grid;
    called with (x, topk_ids, row_of, dispatched, counts, offsets, error, workspace)."""

    def __init__(self, problem: MoEProblem, config: FormConfig, fn):
        self.fn = fn
        self.problem = problem
        self.config = config
        self._checked_devices: set[int] = set()
        # split_block_ranks' codes bound the tokens of a call (block_ranks_encode).
        self._max_tokens = (rank_code_max_tokens(problem, config.grid_blocks)
                            if config.form == SPLIT_BLOCK_RANKS else None)

    def check_device(self, device: int) -> None:
        if device in self._checked_devices or self.config.form in BARRIER_FREE_FORMS:
            return
        cost = cooperative_cost(self.problem, self.config)
        check_cooperative_grid(cost.blocks, cost.threads_per_block, cost.registers_per_thread,
                               cost.smem_per_block, torch.cuda.get_device_properties(device))
        self._checked_devices.add(device)

    def __call__(self, x, topk_ids, row_of, dispatched, counts, offsets, error, workspace):
        self.check_device(x.get_device())
        if self._max_tokens is not None and x.shape[0] > self._max_tokens:
            raise ValueError(
                f"moe_dispatch: {x.shape[0]} tokens are too many for split_block_ranks over "
                f"{self.config.grid_blocks} routing blocks (a block's pairs times the "
                f"{self.problem.local_experts} local experts must stay below {RANK_CODES}); "
                "use more routing blocks or another form")
        self.fn(x, topk_ids, row_of, dispatched, counts, offsets, error, workspace)


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


def launch(compiled: CompiledDispatch, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["topk_ids"], tensors["row_of"], tensors["dispatched"],
             tensors["counts"], tensors["offsets"], tensors["error"], tensors["workspace"])
