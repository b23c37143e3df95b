"""A GPU faked where there is none, for a process that only loads compiled points: what the
device fingerprint (cutetune.results_db.fingerprint) asks of torch and of the driver, answered
as an H200 would. Loading an artifact needs no GPU; nothing may be launched."""

from __future__ import annotations


def fake_h200() -> None:
    """Make this process's torch and CUDA driver bindings answer as an H200 would. It imports
    no cutetune module, so a warmup after it imports what it would on a GPU host."""
    import types

    import torch
    from cuda.bindings import driver

    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0,
                                  multi_processor_count=132)
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_name = lambda device=None: props.name
    driver.cuDriverGetVersion = lambda: (driver.CUresult.CUDA_SUCCESS, 13000)
