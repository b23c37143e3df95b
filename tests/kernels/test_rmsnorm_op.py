"""The public ops' input checks: every check but the device runs before the device is read, so
each bad input is tested here on CPU tensors (which then fail on the device, last)."""

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


def test_valid_cpu_inputs_fail_only_on_the_device():
    x, residual, w = _cpu_inputs()
    with pytest.raises(ValueError, match="x is on cpu: rmsnorm runs on a CUDA device"):
        rmsnorm(x, w)
    with pytest.raises(ValueError, match="x is on cpu: rmsnorm runs on a CUDA device"):
        fused_add_rmsnorm(x, residual, w, out=torch.empty_like(x, dtype=torch.float32),
                          out_dtype=torch.float32)
    # Strided rows aligned to the vector, odd hidden sizes the narrowest vector divides, one
    # row with any stride: all pass every check before the device.
    for args in [(_strided(3, 4096, 8), w), (_strided(3, 2882, 2), torch.ones(2882).bfloat16()),
                 (torch.randn(1, 2881), torch.ones(2881))]:
        with pytest.raises(ValueError, match="runs on a CUDA device"):
            rmsnorm(*args)


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
    # bf16 in, fp32 out: the widest vector is 4 elements, so 4-aligned strides suffice...
    (lambda x, r, w: rmsnorm(_strided(3, 4096, 4), w, out_dtype=torch.float32), ValueError,
     "runs on a CUDA device"),
    # ...but not 2-aligned ones.
    (lambda x, r, w: rmsnorm(_strided(3, 4096, 2), w, out_dtype=torch.float32), ValueError,
     "must start aligned to 4 elements"),
])
def test_bad_input_is_one_clear_error(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(*_cpu_inputs())
