"""The public FP8 quantisation ops' input checks, tested on CPU tensors (devices are checked
last), and their CPU path (the kernels' torch reference): values, the scales' layouts, given
buffers, the fused forms as the unfused chains of the public ops."""

import re

import pytest
import torch

from cutetune.kernels.fp8_quant import quantize_reference
from cutetune.ops.activation import silu_and_mul
from cutetune.ops.fp8_quant import (
    fp8_group_quant,
    fused_add_rmsnorm_fp8_quant,
    rmsnorm_fp8_quant,
    silu_and_mul_fp8_quant,
)
from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm

FP8 = torch.float8_e4m3fn


def _x(tokens=3, width=256, dtype=torch.bfloat16):
    return (4 * torch.randn(tokens, width, generator=torch.Generator().manual_seed(0))).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_path_is_the_reference(group, ue8m0, dtype):
    x = _x(dtype=dtype)
    q, scales = fp8_group_quant(x, group, ue8m0=ue8m0)
    expected_q, expected_scales = quantize_reference(x.float(), group, ue8m0)
    assert q.dtype is FP8 and scales.dtype is torch.float32
    assert scales.shape == (3, 256 // group) and scales.stride() == (256 // group, 1)
    _same(q, expected_q)
    _same(scales, expected_scales)


def test_column_major_scales_are_padded_to_four_tokens():
    x = _x(tokens=5)
    q, scales = fp8_group_quant(x, 64, column_major_scales=True)
    assert scales.shape == (5, 4) and scales.stride() == (1, 8)
    _same(scales, fp8_group_quant(x, 64)[1])


def test_given_buffers_are_written_and_returned():
    x = _x()
    out = torch.empty(3, 272, dtype=FP8)[:, :256]  # a padded row stride of 16 bytes
    scales = torch.empty(2, 16).t()[:3]  # column-major, token stride 16
    q, s = fp8_group_quant(x, 128, column_major_scales=True, out=out, scales=scales)
    assert q is out and s is scales
    expected_q, expected_scales = quantize_reference(x.float(), 128, False)
    _same(out, expected_q)
    _same(scales, expected_scales)


def test_fused_forms_write_what_the_unfused_ops_write():
    x = _x(width=512)
    q, scales = silu_and_mul_fp8_quant(x, 128, column_major_scales=True)
    chained = fp8_group_quant(silu_and_mul(x), 128, column_major_scales=True)
    _same(q, chained[0])
    _same(scales, chained[1])

    weight = (1 + 0.5 * _x(tokens=1, width=256)[0].float()).to(torch.bfloat16)
    h = _x()
    q, scales = rmsnorm_fp8_quant(h, weight, 1e-6, 0.0, 64, ue8m0=True)
    chained = fp8_group_quant(rmsnorm(h, weight, 1e-6), 64, ue8m0=True)
    _same(q, chained[0])
    _same(scales, chained[1])

    residual, chained_residual = _x(), _x()
    q, scales, returned = fused_add_rmsnorm_fp8_quant(h, residual, weight)
    normed, _ = fused_add_rmsnorm(h, chained_residual, weight)
    chained = fp8_group_quant(normed)
    assert returned is residual
    _same(residual, chained_residual)
    _same(q, chained[0])
    _same(scales, chained[1])


def test_no_tokens_is_no_work():
    q, scales = fp8_group_quant(_x(tokens=0), column_major_scales=True)
    assert q.shape == (0, 256) and scales.shape == (0, 2)


def test_meta_tensors_are_refused_by_device():
    with pytest.raises(ValueError, match="x is on meta: the FP8 quantisation runs on a CUDA "
                                         "device or the CPU"):
        fp8_group_quant(_x().to("meta"))


BAD = [
    (dict(x=[1.0]), TypeError, "x must be a torch.Tensor, got list"),
    (dict(x=_x(dtype=torch.float32)), TypeError,
     "x has dtype torch.float32: use torch.bfloat16 or torch.float16"),
    (dict(x=_x()[0]), ValueError, "x must be 2-d (tokens, width), got shape (256,)"),
    (dict(x=_x(), group_size=96), ValueError, "group_size must be an int among (64, 128), got 96"),
    (dict(x=_x(), group_size=True), ValueError,
     "group_size must be an int among (64, 128), got True"),
    # 128.0 == 128, but a float size would reach torch.empty.
    (dict(x=_x(), group_size=128.0), ValueError,
     "group_size must be an int among (64, 128), got 128.0"),
    (dict(x=_x(width=0)), ValueError, "x's width (x.shape[1]) must be positive, got 0"),
    (dict(x=_x(width=320)), ValueError,
     "x's quantised width 320 must be a multiple of group_size 128"),
    (dict(x=_x(), ue8m0=1), TypeError, "ue8m0 must be True or False, got 1"),
    (dict(x=_x(), column_major_scales="yes"), TypeError,
     "column_major_scales must be True or False, got 'yes'"),
    (dict(x=_x(width=512)[:, ::2]), ValueError, "x must have contiguous, non-overlapping rows"),
    (dict(x=_x(width=260)[:, :256]), ValueError,
     "x must start 16-byte aligned and its row stride (260 elements) must be a multiple of 16"),
    (dict(x=_x(), out=torch.empty(3, 256)), TypeError,
     "out has dtype torch.float32: it must be torch.float8_e4m3fn"),
    (dict(x=_x(), out=torch.empty(4, 256, dtype=FP8)), ValueError,
     "out must have shape (3, 256), got (4, 256)"),
    (dict(x=_x(), out=torch.empty(3, 264, dtype=FP8)[:, :256]), ValueError,
     "out must start 16-byte aligned and its row stride (264 elements)"),
    (dict(x=_x(), scales=torch.empty(3, 2, dtype=torch.float64)), TypeError,
     "scales has dtype torch.float64: it must be torch.float32"),
    (dict(x=_x(), scales=torch.empty(3, 4)), ValueError,
     "scales must have shape (3, 2) (tokens, width / group_size), got (3, 4)"),
    (dict(x=_x(), column_major_scales=True, scales=torch.empty(3, 2)), ValueError,
     "scales must be column-major (strides (1, >= 3)) with column_major_scales=True, got "
     "strides (2, 1)"),
    (dict(x=_x(), scales=torch.empty(2, 3).t()), ValueError,
     "scales must be row-major (strides (>= 2, 1)) with column_major_scales=False, got "
     "strides (1, 3)"),
    (dict(x=_x(), scales=[1.0]), TypeError, "scales must be a torch.Tensor, got list"),
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    (dict(x=_x(), out=torch.empty(3, 256, dtype=FP8, device="meta")), ValueError,
     "out is on meta but x is on cpu"),
    (dict(x=_x(), scales=torch.empty(3, 2, device="meta")), ValueError,
     "scales is on meta but x is on cpu"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD,
                         ids=lambda v: re.sub(r"\W+", "-", v)[:48] if isinstance(v, str) else None)
def test_bad_input_is_one_clear_error(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fp8_group_quant(**kwargs)


def test_silu_input_must_be_gate_and_up():
    with pytest.raises(ValueError, match=re.escape(
            "x must be (tokens, 2 * intermediate) with an even last dim, got 257")):
        silu_and_mul_fp8_quant(_x(width=257))
    with pytest.raises(ValueError, match="x's quantised width 192 must be a multiple of "
                                         "group_size 128"):
        silu_and_mul_fp8_quant(_x(width=384))
    with pytest.raises(ValueError, match=re.escape("out must have shape (3, 128)")):
        silu_and_mul_fp8_quant(_x(), out=torch.empty(3, 256, dtype=FP8))


def test_norm_inputs_are_checked_as_rmsnorm_checks_them():
    weight = torch.ones(256, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="weight has dtype torch.float16 but x has "
                                        "torch.bfloat16: they must match"):
        rmsnorm_fp8_quant(_x(), weight.half())
    with pytest.raises(ValueError, match="residual has shape"):
        fused_add_rmsnorm_fp8_quant(_x(), _x(tokens=4), weight)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor, got NoneType"):
        fused_add_rmsnorm_fp8_quant(_x(), None, weight)
    with pytest.raises(ValueError, match="x's quantised width 192 must be a multiple"):
        rmsnorm_fp8_quant(_x(width=192), torch.ones(192, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        rmsnorm_fp8_quant(_x(), weight.to("meta"))


@pytest.mark.parametrize("eps", [float("inf"), float("nan"), 0.0, -1e-6, True, "1e-6"])
def test_norm_eps_must_be_finite_and_positive(eps):
    with pytest.raises(ValueError, match=re.escape(f"eps must be a finite number above 0, got "
                                                   f"{eps!r}")):
        rmsnorm_fp8_quant(_x(), torch.ones(256, dtype=torch.bfloat16), eps=eps)


def test_silu_input_of_no_width_is_named():
    with pytest.raises(ValueError, match=re.escape("x's width (x.shape[1]) must be positive, "
                                                   "got 0")):
        silu_and_mul_fp8_quant(_x(width=0))
