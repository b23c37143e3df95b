"""What a GPU is: its datasheet (DeviceSpec, one per model cutetune knows) and the ceilings it
reaches in practice (Ceilings: datasheet estimates until measured on the device)."""

from __future__ import annotations

from dataclasses import dataclass


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
