"""What identifies the environment a measurement was taken in.

A winner measured on one GPU, driver or library version is served only where all of them match.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata


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


def _driver_version() -> str:
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDriverGetVersion failed: {err}")
    return f"{version // 1000}.{version % 1000 // 10}"
