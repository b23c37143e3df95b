"""run_on_meta refuses what a CUDA graph capture cannot do on the host side, and lets the rest
run."""

from __future__ import annotations

import pytest
import torch

from testkit.capturable import NotCapturable, run_on_meta

X = {"x": torch.arange(8, dtype=torch.float32)}


@pytest.mark.parametrize("function", [
    lambda t: t["x"] * torch.tensor([1.0, 2.0] * 4, device=t["x"].device),
    lambda t: t["x"] * torch.as_tensor([1.0] * 8, device=t["x"].device),
    lambda t: t["x"] + t["x"].new_tensor([1.0] * 8),
    lambda t: t["x"] * torch.arange(8).to(t["x"].device),  # a table built on the CPU
    lambda t: t["x"] * torch.ones(8, device="cpu")[0],
], ids=["tensor", "as_tensor", "new_tensor", "cpu-table", "cpu-element"])
def test_host_data_copied_to_the_device_is_refused(function):
    with pytest.raises(NotCapturable):
        run_on_meta(function, X)


@pytest.mark.parametrize("function", [
    lambda t: t["x"].sum().item(),
    lambda t: t["x"][t["x"] > 3],
    lambda t: 1 if (t["x"] > 3).any() else 0,
], ids=["item", "mask-indexing", "bool"])
def test_reading_device_values_back_raises(function):
    with pytest.raises((RuntimeError, NotImplementedError)):
        run_on_meta(function, X)


def test_work_on_the_device_runs():
    def capturable(t):
        x = t["x"]
        table = torch.arange(8, device=x.device, dtype=torch.float32) * 0.5
        return torch.where(x > 3, 0.0, x * table + torch.full_like(x, 2.0)).clamp(max=6)

    result = run_on_meta(capturable, X)
    assert result.device.type == "meta" and result.shape == (8,)
