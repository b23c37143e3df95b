"""What a kernel declares one call at one config must do (its roofline cost), and how many of its
blocks one SM holds: the kernels compute both, the tuner's roofline reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cost:
    """What one call of a kernel at one config must do."""

    bytes_moved: int
    flops: int
    blocks: int
    threads_per_block: int
    registers_per_thread: int
    smem_per_block: int = 0
    launches: int = 1
    grid_barriers: int = 0
    # Bytes one thread loads before it must wait for them; 0: not modelled.
    bytes_in_flight_per_thread: int = 0


def resident_blocks_per_sm(cost: Cost, spec: Any) -> int:
    """Blocks of this cost one SM holds at once, by threads, registers, shared memory and the
    block limit of `spec` (a cutetune.device.specs.DeviceSpec)."""
    by_threads = spec.max_threads_per_sm // cost.threads_per_block
    by_registers = spec.registers_per_sm // (cost.registers_per_thread * cost.threads_per_block)
    by_smem = spec.smem_per_sm // cost.smem_per_block if cost.smem_per_block else by_threads
    return max(0, min(spec.max_blocks_per_sm, by_threads, by_registers, by_smem))
