"""What bounds a block and a thread: the named constraints every kernel with a
`warps_per_block` knob shares (a block within the device's thread limit, its estimated registers
within one SM's register file), the register estimate the kernels make, and the norms' limits
on what one thread holds and unrolls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutetune.spaces.space import Constraint

WARP = 32
# A norm's thread holds its share of the row (a head, for qk_norm) and of the weight in fp32
# registers between the reduction and the store: at most this many elements of each.
MAX_ELEMENTS_PER_THREAD = 64
# A thread's vector accesses are unrolled at compile time. Beyond 16 CuTeDSL warns about the
# unrolled loop and a compile takes several times longer (measured on qk_norm), while the
# H200's winners need far fewer.
MAX_VECTORS_PER_THREAD = 16
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
