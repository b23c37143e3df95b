"""The public op's input checks that run before anything touches a GPU."""

import re

import pytest
import torch

import cutetune


def _cpu_inputs(dtype=torch.bfloat16):
    q = torch.randn(2, 4, 128).to(dtype)
    k = torch.randn(2, 2, 128).to(dtype)
    w = torch.ones(128, dtype=dtype)
    return q, k, w, w


def test_cpu_tensors_are_normalised_in_place_with_the_reference():
    q, k, _, _ = _cpu_inputs()
    q_weight, k_weight = (1 + 0.5 * torch.randn(2, 128)).bfloat16()

    def expected(x, w):
        x = x.float()
        return (w.float() + 1.0) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    want_q, want_k = expected(q, q_weight), expected(k, k_weight)
    got_q, got_k = cutetune.qk_norm(q, k, q_weight, k_weight, eps=1e-5, weight_bias=1.0)
    assert got_q is q and got_k is k
    torch.testing.assert_close(q.float(), want_q, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), want_k, rtol=1.6e-2, atol=1e-2)


def test_tensors_on_another_device_are_refused():
    q, k, w, _ = _cpu_inputs()
    with pytest.raises(ValueError, match="q is on meta: qk_norm runs on a CUDA device or the "
                                         "CPU"):
        cutetune.qk_norm(q.to("meta"), k.to("meta"), w.to("meta"), w.to("meta"))
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    with pytest.raises(ValueError, match="q_weight is on meta but q is on cpu"):
        cutetune.qk_norm(q, k, w.to("meta"), w)


@pytest.mark.parametrize(("scalars", "message"), [
    (dict(eps=float("inf")), "eps must be a finite number above 0, got inf"),
    (dict(eps=float("nan")), "eps must be a finite number above 0, got nan"),
    (dict(eps=0.0), "eps must be a finite number above 0, got 0.0"),
    (dict(weight_bias=True), "weight_bias must be 0 or 1 (Gemma-style), got True"),
])
def test_bad_scalars_are_refused(scalars, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cutetune.qk_norm(*_cpu_inputs(), **scalars)


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
