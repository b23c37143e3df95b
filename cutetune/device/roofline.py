"""Roofline model: what a point must move and compute, and how long that should take.

Per point the kernel declares a Cost (bytes, FLOPs, grid shape, resources). The device supplies
its datasheet (DeviceSpec) and the ceilings measured on it (copy bandwidth, launch floor, grid
barrier). The predicted time is the launch floor plus barriers plus the larger of the memory and
compute times, where the memory time is stretched by the SMs a small grid leaves idle and by the
last partial wave of a large one. Prediction only ranks and prunes; measurements decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.cost import Cost, resident_blocks_per_sm

GB = 1e9
# Bytes each SM must have in flight to keep DRAM busy (Little's law). On the H200 a row kernel
# loading 16 bytes per thread reaches the copy ceiling with 4-8 warps per block (32 KiB in
# flight per SM) and well under half of it with one warp.
BYTES_IN_FLIGHT_PER_SM = 32 * 1024


@dataclass(frozen=True)
class Prediction:
    floor_us: float
    predicted_us: float
    resident_blocks_per_sm: int
    waves: int
    sm_fraction: float
    wave_efficiency: float
    latency_hiding: float


def floor_us(cost: Cost, spec: DeviceSpec, ceilings: Ceilings) -> float:
    """The roofline floor: bytes at the copy ceiling or FLOPs at the fp32 peak, the larger."""
    memory_us = cost.bytes_moved / (ceilings.copy_gbps * GB) * 1e6
    compute_us = cost.flops / (spec.fp32_tflops * 1e12) * 1e6
    return max(memory_us, compute_us)


@dataclass(frozen=True)
class Occupancy:
    """How a point's grid sits on the device: blocks resident per SM, waves, the share of SMs
    a small grid keeps busy, how full its waves are, and the share of the bytes in flight an
    SM needs (Little's law) that its resident threads have."""

    resident_blocks_per_sm: int
    waves: int
    sm_fraction: float
    wave_efficiency: float
    latency_hiding: float

    @property
    def efficiency(self) -> float:
        """The share of the device's bandwidth the grid can draw on."""
        return self.sm_fraction * self.wave_efficiency * self.latency_hiding


def occupancy(cost: Cost, spec: DeviceSpec,
              bytes_in_flight_per_sm: float = BYTES_IN_FLIGHT_PER_SM) -> Occupancy:
    resident = resident_blocks_per_sm(cost, spec)
    if resident == 0:
        raise ValueError(f"a block of {cost.threads_per_block} threads cannot be resident on "
                         f"{spec.name}")
    capacity = resident * spec.sm_count
    waves = math.ceil(cost.blocks / capacity)
    sm_fraction = min(1.0, cost.blocks / spec.sm_count)
    wave_efficiency = cost.blocks / (waves * capacity) if waves > 1 else 1.0
    latency_hiding = 1.0
    if cost.bytes_in_flight_per_thread:
        blocks_per_busy_sm = min(resident, math.ceil(cost.blocks / spec.sm_count))
        in_flight = blocks_per_busy_sm * cost.threads_per_block * cost.bytes_in_flight_per_thread
        busy_sms = min(cost.blocks, spec.sm_count)
        # A small problem cannot keep more in flight than it has to move.
        needed = min(bytes_in_flight_per_sm, cost.bytes_moved / busy_sms)
        latency_hiding = min(1.0, in_flight / needed)
    return Occupancy(resident, waves, sm_fraction, wave_efficiency, latency_hiding)


def predict(cost: Cost, spec: DeviceSpec, ceilings: Ceilings) -> Prediction:
    grid = occupancy(cost, spec)
    base = floor_us(cost, spec, ceilings)
    predicted = (cost.launches * ceilings.launch_floor_us
                 + cost.grid_barriers * ceilings.grid_barrier_us
                 + base / grid.efficiency)
    return Prediction(base, predicted, grid.resident_blocks_per_sm, grid.waves,
                      grid.sm_fraction, grid.wave_efficiency, grid.latency_hiding)


def percent_of_roofline(cost: Cost, spec: DeviceSpec, ceilings: Ceilings,
                        measured_us: float) -> float:
    return 100.0 * floor_us(cost, spec, ceilings) / measured_us


def achieved_gbps(cost: Cost, measured_us: float) -> float:
    return cost.bytes_moved / (measured_us * 1e-6) / GB
