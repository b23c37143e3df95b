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

from cutetune.kernels.cost import Cost, resident_blocks_per_sm

GB = 1e9
# Bytes each SM must have in flight to keep DRAM busy (Little's law). On the H200 a row kernel
# loading 16 bytes per thread reaches the copy ceiling with 4-8 warps per block (32 KiB in
# flight per SM) and well under half of it with one warp.
BYTES_IN_FLIGHT_PER_SM = 32 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers for one GPU model."""

    name: str
    compute_capability: str
    dram_gbps: float
    sm_count: int
    l2_bytes: int
    registers_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int
    bf16_tflops: float
    fp32_tflops: float


DEVICE_SPECS: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        DeviceSpec("H100 SXM", "9.0", 3350.0, 132, 50 * 2**20, 65536, 1024, 2048, 32,
                   228 * 1024, 989.0, 67.0),
        # 60 MB of L2 is what torch reports on the H200 here (the datasheet does not say).
        DeviceSpec("H200", "9.0", 4800.0, 132, 60 * 2**20, 65536, 1024, 2048, 32,
                   228 * 1024, 989.0, 67.0),
        DeviceSpec("B200", "10.0", 8000.0, 148, 126 * 2**20, 65536, 1024, 2048, 32,
                   228 * 1024, 2250.0, 80.0),
    )
}


def device_spec_for(gpu_name: str) -> DeviceSpec:
    """The spec whose name matches a CUDA device name such as 'NVIDIA H100 80GB HBM3'."""
    upper = gpu_name.upper()
    if "H200" in upper:
        return DEVICE_SPECS["H200"]
    if "H100" in upper and not ("PCIE" in upper or "NVL" in upper):
        return DEVICE_SPECS["H100 SXM"]
    if "B200" in upper:
        return DEVICE_SPECS["B200"]
    raise ValueError(f"no DeviceSpec for GPU {gpu_name!r}: known are {', '.join(DEVICE_SPECS)}")


@dataclass(frozen=True)
class Ceilings:
    """What the device reaches in practice; measured values replace the defaults."""

    copy_gbps: float
    launch_floor_us: float
    grid_barrier_us: float
    measured: bool

    @classmethod
    def from_datasheet(cls, spec: DeviceSpec) -> Ceilings:
        # Before anything is measured: 90% of the datasheet bandwidth (about what a copy
        # kernel reaches on the H200), and the H200's launch floor and grid-barrier cost
        # (docs/performance-notes.md, Framework); measured values replace all three.
        return cls(spec.dram_gbps * 0.9, 0.55, 1.0, measured=False)

    @classmethod
    def from_measured(cls, spec: DeviceSpec, values: dict[str, float]) -> Ceilings:
        default = cls.from_datasheet(spec)
        unknown = set(values) - {"copy_gbps", "launch_floor_us", "grid_barrier_us"}
        if unknown:
            raise ValueError(f"unknown ceilings {sorted(unknown)}: known are copy_gbps, "
                             "launch_floor_us, grid_barrier_us")
        if not values:
            return default
        return cls(
            copy_gbps=values.get("copy_gbps", default.copy_gbps),
            launch_floor_us=values.get("launch_floor_us", default.launch_floor_us),
            grid_barrier_us=values.get("grid_barrier_us", default.grid_barrier_us),
            measured=True,
        )


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


def predict(cost: Cost, spec: DeviceSpec, ceilings: Ceilings) -> Prediction:
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
        needed = min(BYTES_IN_FLIGHT_PER_SM, cost.bytes_moved / busy_sms)
        latency_hiding = min(1.0, in_flight / needed)
    base = floor_us(cost, spec, ceilings)
    predicted = (cost.launches * ceilings.launch_floor_us
                 + cost.grid_barriers * ceilings.grid_barrier_us
                 + base / (sm_fraction * wave_efficiency * latency_hiding))
    return Prediction(base, predicted, resident, waves, sm_fraction, wave_efficiency,
                      latency_hiding)


def percent_of_roofline(cost: Cost, spec: DeviceSpec, ceilings: Ceilings,
                        measured_us: float) -> float:
    return 100.0 * floor_us(cost, spec, ceilings) / measured_us


def achieved_gbps(cost: Cost, measured_us: float) -> float:
    return cost.bytes_moved / (measured_us * 1e-6) / GB
