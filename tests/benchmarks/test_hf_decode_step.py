"""benchmarks/hf_decode_step.py on the CPU: which profiler events its kernel time sums and
which of them it counts as cutetune's, and the routing it compares logits on."""

from __future__ import annotations

import sys

import torch
from torch.autograd.profiler_util import FunctionEvent

from benchmarks import hf_decode_step
from cutetune.integrations.transformers import patch, unpatch
from testkit.qwen3_moe_standin import VOCAB, build_standin, transformers_stub


def event(name: str, start_us: int, end_us: int, device_type=torch.autograd.DeviceType.CUDA):
    return FunctionEvent(id=start_us, name=name, thread=0, start_us=start_us, end_us=end_us,
                         device_type=device_type)


def test_the_device_time_sums_device_events_and_counts_cutedsl_kernels_as_cutetunes():
    events = [
        event("kernel_cutlass__rmsnorm_kernel_tensorptrbf16_0", 0, 3),
        event("nvjet_tst_128x64_64x4_2x1_v_bz_TNN", 3, 20),  # a cuBLAS GEMM
        event("kernel_cutlass_replicated_kernel_tensorptri32_0", 20, 25),
        event("Memcpy DtoD (Device -> Device)", 25, 26),
        event("aten::linear", 0, 30, torch.autograd.DeviceType.CPU),  # host side: not summed
    ]
    assert hf_decode_step.device_time_split(events) == (26, 8)


def test_no_device_events_give_zero():
    assert hf_decode_step.device_time_split(
        [event("aten::add", 0, 5, torch.autograd.DeviceType.CPU)]) == (0, 0)


def test_the_patched_logits_are_compared_on_the_unpatched_routing(monkeypatch):
    """The stand-in's 64 tokens of seed 0 meet router ties (tests/integrations): compared on
    the unpatched forward's routing, the patched logits are off by bf16 rounding only."""
    for name, module in transformers_stub().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(hf_decode_step, "time_us", lambda call, repeats: (0.0, 0.0))
    model = build_standin(torch.bfloat16, "cpu")
    inputs = {"64 tokens": torch.randint(0, VOCAB, (1, 64),
                                         generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        unpatched = hf_decode_step.unpatched_outputs(model, model, inputs)
        patch(model)
        rows = hf_decode_step.timed_rows("cutetune", model, model, inputs, unpatched, 1,
                                         graph=False)
        unpinned = (model(inputs["64 tokens"]) - unpatched["64 tokens"][0]).abs().max().item()
        unpatch(model)
    (case, variant, _, _, note), = rows
    pinned = float(note.removeprefix("max |logit diff| "))
    assert (case, variant) == ("64 tokens", "cutetune, eager")
    assert pinned < 0.05 < unpinned
