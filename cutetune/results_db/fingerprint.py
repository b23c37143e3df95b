"""What identifies the environment a measurement was taken in, and which of it a winner needs.

A winner is served only on the GPU it was measured on (model, compute capability, SM count) and
with the CuTeDSL version that compiled it (MUST_MATCH; the kernel's code hash is checked by the
dispatcher). The driver, the CUDA runtime and torch may differ (MAY_DIFFER): their patch releases
do not change the code a point compiles to, so such a winner is served, and the dispatcher's
report names every difference.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import metadata
from typing import TypeVar

from cutetune.results_db.records import Winner

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceFingerprint:
    gpu_name: str
    compute_capability: str
    sm_count: int
    driver: str
    cuda: str
    torch: str
    cutlass_dsl: str

    @classmethod
    def current(cls, device_index: int | None = None) -> DeviceFingerprint:
        """The fingerprint of the CUDA device in use; RuntimeError where there is none."""
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible: tuning and warmup need an NVIDIA GPU")
        index = torch.cuda.current_device() if device_index is None else device_index
        props = torch.cuda.get_device_properties(index)
        return cls(
            gpu_name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            driver=_driver_version(),
            cuda=str(torch.version.cuda),
            torch=torch.__version__,
            cutlass_dsl=metadata.version("nvidia-cutlass-dsl"),
        )


MUST_MATCH = ("gpu_name", "compute_capability", "sm_count", "cutlass_dsl")
MAY_DIFFER = ("driver", "cuda", "torch")


def serves_here(measured: DeviceFingerprint, here: DeviceFingerprint) -> bool:
    """Whether a winner measured under `measured` may be served `here`."""
    return all(getattr(measured, name) == getattr(here, name) for name in MUST_MATCH)


def environment_differences(measured: DeviceFingerprint, here: DeviceFingerprint) -> str:
    """The MAY_DIFFER fields that differ, as 'torch 2.11.0 (here 2.11.1)'; empty if none."""
    return ", ".join(f"{name} {getattr(measured, name)} (here {getattr(here, name)})"
                     for name in MAY_DIFFER if getattr(measured, name) != getattr(here, name))


def choose_to_serve(measured: Iterable[tuple[DeviceFingerprint, Winner]],
                    here: DeviceFingerprint) -> list[Winner]:
    """Of winners with the devices they were measured on, those the fingerprint policy lets
    `here` serve, one per kernel source, problem and bucket: one measured in this very
    environment where there is one, else the most recent; each says how its environment
    differed (Winner.measured_elsewhere)."""
    chosen: dict[tuple[str, str, str, int], Winner] = {}
    for device, winner in measured:
        if not serves_here(device, here):
            continue
        winner = replace(winner, measured_elsewhere=environment_differences(device, here))
        key = (winner.kernel_name, winner.source_hash, winner.static_key, winner.bucket)
        held = chosen.get(key)
        if held is None or _preferred(winner, held):
            chosen[key] = winner
    return list(chosen.values())


def latest_serving_here(measured: Iterable[tuple[DeviceFingerprint, datetime, T]],
                        here: DeviceFingerprint) -> T | None:
    """Of items stored with a device and a time (a device's calibrations), the one the
    fingerprint policy lets `here` use: one of this very environment where there is one, then
    the most recent; None where none may be used."""
    usable = [(device == here, when, item) for device, when, item in measured
              if serves_here(device, here)]
    return max(usable, key=lambda u: u[:2])[2] if usable else None


def _preferred(candidate: Winner, held: Winner) -> bool:
    """A winner of this environment before one of another; then the more recent."""
    return (not candidate.measured_elsewhere, candidate.updated_at) > (
        not held.measured_elsewhere, held.updated_at)


def _driver_version() -> str:
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDriverGetVersion failed: {err}")
    return f"{version // 1000}.{version % 1000 // 10}"
