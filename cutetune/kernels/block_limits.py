"""The named constraints every kernel with a `warps_per_block` knob shares: a block within the
device's thread limit, and its estimated registers within one SM's register file; and the
register estimate the kernels make for the second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutetune.spaces.space import Constraint

WARP = 32
# Registers a thread spends besides the data it holds across a wait: addressing, loop and
# reduction state.
STATE_REGISTERS = 32


def estimated_registers(held: int) -> int:
    """Registers per thread of a thread that holds `held` 32-bit registers of data (fp32
    values, packed vectors, indices) across its wait for memory."""
    return STATE_REGISTERS + held


def block_size_within_device() -> Constraint:
    return Constraint(
        "block_size_within_device",
        "warps_per_block * 32 must not exceed the device's threads per block",
        lambda p, c, d: c.warps_per_block * WARP <= d.max_threads_per_block,
    )


def block_fits_register_file(registers_per_thread: Callable[[Any, Any], int]) -> Constraint:
    """`registers_per_thread(problem, config)`: the kernel's own estimate."""
    return Constraint(
        "block_fits_register_file",
        "the block's estimated registers must fit one SM's register file",
        lambda p, c, d: registers_per_thread(p, c) * c.warps_per_block * WARP
        <= d.registers_per_sm,
    )
