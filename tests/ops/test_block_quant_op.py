"""The public block-scaled quantisation ops' input checks, tested on CPU tensors (devices are
checked last), and their CPU path (the kernel's reference, bit for bit)."""

import re

import pytest
import torch

from cutetune.kernels.block_quant import MXFP8QuantProblem, NVFP4QuantProblem, quantised
from cutetune.ops.block_quant import mxfp8_quant, nvfp4_quant

GLOBAL = torch.tensor([448.0 * 6 / 8])


def _x(tokens=5, hidden=256, dtype=torch.bfloat16):
    return (4 * torch.randn(tokens, hidden)).to(dtype)


def _mx(x, **kw):
    return mxfp8_quant(x, **kw)


def _nv(x, **kw):
    return nvfp4_quant(x, kw.pop("global_scale", GLOBAL), **kw)


@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
@pytest.mark.parametrize(("op", "kind"), [(_mx, MXFP8QuantProblem), (_nv, NVFP4QuantProblem)])
def test_cpu_path_is_the_reference_bit_for_bit(op, kind, layout):
    x = _x(tokens=130)
    q, scales = op(x, scale_layout=layout)
    problem = kind(num_tokens=130, dtype="bfloat16", hidden=256, scale_layout=layout)
    want_q, want_scales = quantised(x, problem, GLOBAL)
    assert q.dtype == want_q.dtype and scales.dtype == want_scales.dtype
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_scales.view(torch.uint8))
    # Into given buffers: the same bytes, the same tensors returned.
    q_out, scales_out = torch.empty_like(q), torch.empty_like(scales)
    got = op(x, scale_layout=layout, q=q_out, scales=scales_out)
    assert got[0] is q_out and got[1] is scales_out
    assert torch.equal(q_out.view(torch.uint8), q.view(torch.uint8))


def test_no_tokens():
    q, scales = mxfp8_quant(_x(tokens=0))
    assert q.shape == (0, 256) and scales.shape == (0, 8)


MX_BAD = [
    (dict(x=[1.0]), TypeError, "x must be a torch.Tensor, got list"),
    (dict(x=_x(dtype=torch.float32)), TypeError,
     "x has dtype torch.float32: mxfp8_quant quantises torch.bfloat16 or torch.float16"),
    (dict(x=_x()[0]), ValueError, "x must be (tokens, hidden), got shape (256,)"),
    (dict(x=_x(hidden=80)), ValueError,
     "x's hidden size 80 must be a multiple of mxfp8's block of 32 elements"),
    # Zero divides every block: named, not taken for a misaligned row.
    (dict(x=_x(hidden=0)), ValueError, "x's hidden size (x.shape[1]) must be positive, got 0"),
    (dict(x=_x(), q=torch.empty(5, 256, dtype=torch.float8_e4m3fn, device="meta")), ValueError,
     "q is on meta but x is on cpu"),
    (dict(x=_x(), scale_layout="column_major"), ValueError,
     "scale_layout must be one of ('swizzled', 'row_major'), got 'column_major'"),
    (dict(x=_x(hidden=512)[:, ::2]), ValueError, "the rows of x must be contiguous"),
    (dict(x=_x(hidden=264)[:, :256]), ValueError,
     "x must start 32-byte aligned with a row stride a multiple of 32 bytes"),
    (dict(x=_x(), q=torch.empty(5, 256, dtype=torch.bfloat16)), TypeError,
     "q has dtype torch.bfloat16: it must be torch.float8_e4m3fn"),
    (dict(x=_x(), q=torch.empty(4, 256, dtype=torch.float8_e4m3fn)), ValueError,
     "q must have shape (5, 256), got (4, 256)"),
    (dict(x=_x(), scales=torch.empty(128, 8, dtype=torch.uint8)), TypeError,
     "scales has dtype torch.uint8: it must be torch.float8_e8m0fnu"),
    (dict(x=_x(), scales=torch.empty(5, 8, dtype=torch.float8_e8m0fnu)), ValueError,
     "scales must have shape (128, 8), got (5, 8)"),
    (dict(x=_x(), scale_layout="row_major",
          scales=torch.empty(128, 8, dtype=torch.float8_e8m0fnu)), ValueError,
     "scales must have shape (5, 8), got (128, 8)"),
    (dict(x=_x(), scales=torch.empty(8, 128, dtype=torch.float8_e8m0fnu).t()), ValueError,
     "scales must be contiguous and start 16-byte aligned"),
]


@pytest.mark.parametrize(("arguments", "error", "message"), MX_BAD)
def test_mxfp8_bad_inputs(arguments, error, message):
    with pytest.raises(error, match=re.escape(message)):
        mxfp8_quant(**arguments)


NV_BAD = [
    (dict(x=_x(hidden=40)), ValueError,
     "x's hidden size 40 must be a multiple of nvfp4's block of 16 elements"),
    (dict(x=_x(), global_scale=torch.tensor([1.0], dtype=torch.float64)), TypeError,
     "global_scale has dtype torch.float64: it must be torch.float32"),
    (dict(x=_x(), global_scale=torch.tensor([1.0, 2.0])), ValueError,
     "global_scale must have shape (1,), got (2,)"),
    (dict(x=_x(), global_scale=1.0), TypeError, "global_scale must be a torch.Tensor, got float"),
    (dict(x=_x(), global_scale=None), TypeError,
     "global_scale must be a torch.Tensor, got NoneType (a torch.float32 tensor of shape (1,))"),
    (dict(x=_x(hidden=0)), ValueError, "x's hidden size (x.shape[1]) must be positive, got 0"),
    # Packed two per byte: q is half as wide as x.
    (dict(x=_x(), q=torch.empty(5, 256, dtype=torch.float4_e2m1fn_x2)), ValueError,
     "q must have shape (5, 128), got (5, 256)"),
    (dict(x=_x(), q=torch.empty(5, 256, dtype=torch.uint8)), TypeError,
     "q has dtype torch.uint8: it must be torch.float4_e2m1fn_x2"),
    (dict(x=_x(), scales=torch.empty(128, 16, dtype=torch.float8_e8m0fnu)), TypeError,
     "scales has dtype torch.float8_e8m0fnu: it must be torch.float8_e4m3fn"),
    (dict(x=_x(), scales=torch.empty(128, 4, dtype=torch.float8_e4m3fn)), ValueError,
     "scales must have shape (128, 16), got (128, 4)"),
    (dict(x=_x(), global_scale=GLOBAL.to("meta")), ValueError,
     "global_scale is on meta but x is on cpu"),
]


@pytest.mark.parametrize(("arguments", "error", "message"), NV_BAD)
def test_nvfp4_bad_inputs(arguments, error, message):
    arguments.setdefault("global_scale", GLOBAL)
    with pytest.raises(error, match=re.escape(message)):
        nvfp4_quant(**arguments)


def test_meta_tensors_are_refused():
    with pytest.raises(ValueError, match="x is on meta: mxfp8_quant runs on a CUDA device or "
                                         "the CPU"):
        mxfp8_quant(_x().to("meta"))


def _bytes_equal(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b,
                                                                                     strict=True))


@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
def test_compiled_calls_compute_what_eager_ones_do(layout):
    """torch.compile(fullgraph=True) records the allocating custom ops, and nvfp4_quant's
    writing one where the buffers are given; the outputs are the eager ones, bit for bit."""
    x = _x(tokens=7)

    def allocating(x, global_scale):
        return (*mxfp8_quant(x, layout), *nvfp4_quant(x, global_scale, layout))

    assert _bytes_equal(torch.compile(allocating, fullgraph=True)(x, GLOBAL),
                        allocating(x, GLOBAL))
    eager = nvfp4_quant(x, GLOBAL, layout)
    buffers = (torch.empty_like(eager[0]), torch.empty_like(eager[1]))

    def writing(x, global_scale, q, scales):
        return nvfp4_quant(x, global_scale, layout, q, scales)

    torch.compile(writing, fullgraph=True)(x, GLOBAL, *buffers)
    assert _bytes_equal(buffers, eager)
