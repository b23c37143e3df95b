"""Compile and launch moe_dispatch: one launcher traced per form (its kernels on one stream),
compiled from fake tensors, and the check that a cooperative grid fits the device before it
launches."""

from __future__ import annotations

import torch

from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.moe_dispatch.common import (
    BARRIER_FREE_FORMS,
    RANK_CODES,
    SPLIT_BLOCK_RANKS,
    FormConfig,
    cooperative_cost,
    rank_code_max_tokens,
)
from cutetune.kernels.registry import Tensors

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


def launch(compiled: CompiledDispatch, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["topk_ids"], tensors["row_of"], tensors["dispatched"],
             tensors["counts"], tensors["offsets"], tensors["error"], tensors["workspace"])
