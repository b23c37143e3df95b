"""The public ops' input checks, tested on CPU tensors (the device is checked last), and the CPU
path: valid CPU inputs are computed with the kernel's fp32 reference, written as the kernel
writes them."""

import re

import pytest
import torch

from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm


def _cpu_inputs(rows=4, hidden=4096, dtype=torch.bfloat16):
    x = torch.randn(rows, hidden).to(dtype)
    residual = torch.randn(rows, hidden).to(dtype)
    w = torch.ones(hidden, dtype=dtype)
    return x, residual, w


def _strided(rows, hidden, pad, dtype=torch.bfloat16):
    return torch.randn(rows, hidden + pad).to(dtype)[:, :hidden]


def _expected(x, w, eps=1e-6, weight_bias=0.0):
    x = x.float()
    return (w.float() + weight_bias) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_valid_cpu_inputs_are_computed_with_the_reference():
    x, residual, w = _cpu_inputs()
    w = (1 + 0.5 * torch.randn(w.shape)).to(w.dtype)
    out = rmsnorm(x, w, eps=1e-5, weight_bias=1.0)
    assert out.dtype == x.dtype
    torch.testing.assert_close(out.float(), _expected(x, w, 1e-5, 1.0), rtol=1.6e-2, atol=1e-2)
    summed = (x.float() + residual.float()).to(x.dtype)
    out = torch.empty_like(x, dtype=torch.float32)
    got, got_residual = fused_add_rmsnorm(x, residual, w, out=out, out_dtype=torch.float32)
    assert got is out and got_residual is residual
    assert torch.equal(residual, summed)  # updated in place, rounded to x's dtype
    torch.testing.assert_close(out, _expected(summed, w), rtol=1e-5, atol=1e-5)
    # Strided rows aligned to the vector, odd hidden sizes the narrowest vector divides, one
    # row with any stride: all pass every check.
    for x, weight in [(_strided(3, 4096, 8), w),
                      (_strided(3, 2882, 2), torch.ones(2882).bfloat16()),
                      (torch.randn(1, 2881), torch.ones(2881))]:
        torch.testing.assert_close(rmsnorm(x, weight).float(), _expected(x, weight),
                                   rtol=1.6e-2, atol=1e-2)
    x = _strided(3, 4096, 4)
    torch.testing.assert_close(rmsnorm(x, w, out_dtype=torch.float32), _expected(x, w))


def test_tensors_on_another_device_are_refused():
    x, _, w = _cpu_inputs()
    with pytest.raises(ValueError, match="x is on meta: rmsnorm runs on a CUDA device or the "
                                         "CPU"):
        rmsnorm(x.to("meta"), w.to("meta"))


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda x, r, w: rmsnorm(x.tolist(), w), TypeError, "x must be a torch.Tensor, got list"),
    (lambda x, r, w: rmsnorm(x, None), TypeError, "weight must be a torch.Tensor, got NoneType"),
    (lambda x, r, w: fused_add_rmsnorm(x, None, w), TypeError,
     "residual must be a torch.Tensor, got NoneType"),
    (lambda x, r, w: rmsnorm(x, w, out=[0.0]), TypeError, "out must be a torch.Tensor, got list"),
    (lambda x, r, w: rmsnorm(x.double(), w), TypeError,
     "x has dtype torch.float64: use one of torch.bfloat16, torch.float16, torch.float32"),
    (lambda x, r, w: rmsnorm(x, w.half()), TypeError,
     "weight has dtype torch.float16 but x has torch.bfloat16: they must match"),
    (lambda x, r, w: fused_add_rmsnorm(x, r.float(), w), TypeError,
     "residual has dtype torch.float32 but x has torch.bfloat16: they must match"),
    (lambda x, r, w: rmsnorm(x, w, out_dtype=torch.int8), TypeError,
     "out_dtype torch.int8 is not supported"),
    (lambda x, r, w: rmsnorm(x, w, out_dtype=torch.float32, out=torch.empty_like(x)), TypeError,
     "out has dtype torch.bfloat16 but out_dtype is torch.float32"),
    (lambda x, r, w: rmsnorm(x, w, out=torch.empty_like(x, dtype=torch.float64)), TypeError,
     "out_dtype torch.float64 is not supported"),
    (lambda x, r, w: rmsnorm(x[None], w), ValueError,
     "x must be (rows, hidden), got shape (1, 4, 4096)"),
    (lambda x, r, w: rmsnorm(x[:, :32], w[:32]), ValueError,
     "hidden size 32 is not supported: use 64 to 16384"),
    (lambda x, r, w: rmsnorm(torch.randn(2, 2881).bfloat16(), torch.ones(2881).bfloat16()),
     ValueError, "hidden size 2881 must be a multiple of 2 for torch.bfloat16 in, "
                 "torch.bfloat16 out"),
    (lambda x, r, w: fused_add_rmsnorm(x, r[:3], w), ValueError,
     "residual has shape (3, 4096) but x has (4, 4096)"),
    (lambda x, r, w: rmsnorm(x, w, out=torch.empty(4, 2048, dtype=torch.bfloat16)), ValueError,
     "out has shape (4, 2048) but x has (4, 4096)"),
    (lambda x, r, w: rmsnorm(x, w[:2048]), ValueError,
     "weight must be a contiguous (4096,) vector, got shape (2048,)"),
    (lambda x, r, w: rmsnorm(x, torch.ones(8192).bfloat16()[::2]), ValueError,
     "weight must be a contiguous (4096,) vector"),
    (lambda x, r, w: rmsnorm(x.t().contiguous().t(), w), ValueError,
     "x, residual and out must have contiguous, non-overlapping rows"),
    (lambda x, r, w: fused_add_rmsnorm(x, torch.ones(1, 4096).bfloat16().expand(4, 4096), w),
     ValueError, "residual (0, 1)"),
    (lambda x, r, w: rmsnorm(_strided(3, 4096, 4), w), ValueError,
     "must start aligned to 8 elements and their row strides must be multiples of 8 elements"),
    (lambda x, r, w: rmsnorm(x.flatten()[1:4097][None], w), ValueError,
     "must start aligned to 8 elements"),
    (lambda x, r, w: rmsnorm(x, w, out=torch.empty(4 * 4096 + 2, dtype=torch.bfloat16)[2:]
                             .view(4, 4096)), ValueError, "must start aligned"),
    (lambda x, r, w: rmsnorm(x, torch.ones(4097).bfloat16()[1:]), ValueError,
     "must start aligned to 8 elements"),
    # bf16 in, fp32 out: the widest vector is 4 elements, so 4-aligned strides suffice (the
    # valid-input test above), but not 2-aligned ones.
    (lambda x, r, w: rmsnorm(_strided(3, 4096, 2), w, out_dtype=torch.float32), ValueError,
     "must start aligned to 4 elements"),
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    (lambda x, r, w: rmsnorm(x, w.to("meta")), ValueError, "weight is on meta but x is on cpu"),
    (lambda x, r, w: rmsnorm(x, w, out=torch.empty_like(x, device="meta")), ValueError,
     "out is on meta but x is on cpu"),
    (lambda x, r, w: fused_add_rmsnorm(x, r.to("meta"), w), ValueError,
     "residual is on meta but x is on cpu"),
    (lambda x, r, w: rmsnorm(x, w, eps=float("inf")), ValueError,
     "eps must be a finite number above 0, got inf"),
    (lambda x, r, w: rmsnorm(x, w, eps=float("nan")), ValueError,
     "eps must be a finite number above 0, got nan"),
    (lambda x, r, w: rmsnorm(x, w, eps=True), ValueError,
     "eps must be a finite number above 0, got True"),
    (lambda x, r, w: rmsnorm(x, w, weight_bias="0"), ValueError,
     "weight_bias must be 0 or 1 (Gemma-style), got '0'"),
    (lambda x, r, w: rmsnorm(x, w, weight_bias=True), ValueError,
     "weight_bias must be 0 or 1 (Gemma-style), got True"),
])
def test_bad_input_is_one_clear_error(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(*_cpu_inputs())
