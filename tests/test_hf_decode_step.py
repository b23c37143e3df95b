"""benchmarks/hf_decode_step.py's kernel time on the CPU: which profiler events it sums, and
which of them it counts as cutetune's."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch.autograd.profiler_util import FunctionEvent

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def hf_decode_step(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS_DIR))
    return importlib.import_module("hf_decode_step")


def event(name: str, start_us: int, end_us: int, device_type=torch.autograd.DeviceType.CUDA):
    return FunctionEvent(id=start_us, name=name, thread=0, start_us=start_us, end_us=end_us,
                         device_type=device_type)


def test_the_device_time_sums_device_events_and_counts_cutedsl_kernels_as_cutetunes(
        hf_decode_step):
    events = [
        event("kernel_cutlass__rmsnorm_kernel_tensorptrbf16_0", 0, 3),
        event("nvjet_tst_128x64_64x4_2x1_v_bz_TNN", 3, 20),  # a cuBLAS GEMM
        event("kernel_cutlass_replicated_kernel_tensorptri32_0", 20, 25),
        event("Memcpy DtoD (Device -> Device)", 25, 26),
        event("aten::linear", 0, 30, torch.autograd.DeviceType.CPU),  # host side: not summed
    ]
    assert hf_decode_step.device_time_split(events) == (26, 8)


def test_no_device_events_give_zero(hf_decode_step):
    assert hf_decode_step.device_time_split(
        [event("aten::add", 0, 5, torch.autograd.DeviceType.CPU)]) == (0, 0)
