"""The public op's input checks that run before anything touches a GPU."""

import pytest
import torch

import cutetune


def _cpu_inputs(dtype=torch.bfloat16):
    q = torch.randn(2, 4, 128).to(dtype)
    k = torch.randn(2, 2, 128).to(dtype)
    w = torch.ones(128, dtype=dtype)
    return q, k, w, w


def test_cpu_tensors_are_rejected_with_the_device_named():
    with pytest.raises(ValueError, match="q is on cpu: qk_norm runs on a CUDA device"):
        cutetune.qk_norm(*_cpu_inputs())


def test_non_tensor_is_rejected():
    q, k, w, _ = _cpu_inputs()
    with pytest.raises(TypeError, match="k_weight must be a torch.Tensor, got list"):
        cutetune.qk_norm(q, k, w, [1.0] * 128)


def test_unsupported_dtype_lists_the_accepted_ones():
    with pytest.raises(TypeError, match="q has dtype torch.float64: use one of torch.bfloat16"):
        cutetune.qk_norm(*_cpu_inputs(torch.float64))


def test_mismatched_dtype_names_the_tensor():
    q, k, w, _ = _cpu_inputs()
    with pytest.raises(TypeError, match="k_weight has dtype torch.float16 but q has"):
        cutetune.qk_norm(q, k, w, w.half())
