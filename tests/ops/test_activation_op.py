"""The public gated-activation ops' input checks, tested on CPU tensors (devices are checked
last), and their CPU path (the kernel's fp32 reference)."""

import re

import pytest
import torch

from cutetune.ops.activation import gelu_and_mul, silu_and_mul

INTERMEDIATE = 64


def _x(tokens=3, dtype=torch.bfloat16, width=2 * INTERMEDIATE):
    return torch.randn(tokens, width).to(dtype)


def _out(tokens=3, dtype=torch.bfloat16):
    return torch.empty(tokens, INTERMEDIATE, dtype=dtype)


OPS = [pytest.param(silu_and_mul, "silu_and_mul", id="silu"),
       pytest.param(lambda x, out=None: gelu_and_mul(x, "tanh", out=out), "gelu_and_mul",
                    id="gelu")]


@pytest.mark.parametrize(("op", "name"), OPS)
def test_valid_cpu_inputs_are_computed_with_the_reference(op, name):
    x = _x()
    gate, up = x.float().chunk(2, dim=1)
    act = (torch.nn.functional.silu(gate) if name == "silu_and_mul"
           else torch.nn.functional.gelu(gate, approximate="tanh"))
    out = _out()
    assert op(x, out=out) is out
    torch.testing.assert_close(out.float(), act * up, rtol=1.6e-2, atol=1e-2)
    assert op(x).dtype == x.dtype
    with pytest.raises(ValueError, match=f"x is on meta: {name} runs on a CUDA device or the "
                                         "CPU"):
        op(x.to("meta"))


@pytest.mark.parametrize(("op", "name"), OPS)
@pytest.mark.parametrize(("x", "out", "error", "message"), [
    ([1.0] * 128, None, TypeError, "x must be a torch.Tensor, got list"),
    (_x(dtype=torch.float64), None, TypeError,
     "x has dtype torch.float64: use one of torch.bfloat16, torch.float16, torch.float32"),
    (_x(dtype=torch.int32), None, TypeError, "x has dtype torch.int32"),
    (_x()[0], None, ValueError, "x must be (tokens, 2 * intermediate) with an even last dim, "
                                "got shape (128,)"),
    (_x().view(3, 2, 64), None, ValueError, "got shape (3, 2, 64)"),
    (_x(width=130)[:, :129], None, ValueError, "an even last dim, got shape (3, 129)"),
    # 2 * 12 bf16: I = 12 elements, 24 bytes.
    (_x(width=24), None, ValueError, "the intermediate width 12 must be a multiple of 16 bytes "
                                     "(8 elements of torch.bfloat16)"),
    (_x(width=24, dtype=torch.float32)[:, :20], None, ValueError,
     "the intermediate width 10 must be a multiple of 16 bytes (4 elements of torch.float32)"),
    (_x(width=256)[:, ::2], None, ValueError,
     "the rows of x must be contiguous (strides (*, 1)), got strides (256, 2)"),
    (_x(width=132)[:, :128], None, ValueError,
     "the row stride of x (132 elements) must be a multiple of 16 bytes"),
    (_x(width=129)[:, 1:], None, ValueError,
     "the row stride of x (129 elements) must be a multiple of 16 bytes"),
    (_x(width=136)[:, 4:132], None, ValueError, "x must start 16-byte aligned"),
    (_x(), [0.0], TypeError, "out must be a torch.Tensor, got list"),
    (_x(), _out(dtype=torch.float16), TypeError,
     "out has dtype torch.float16 but x has torch.bfloat16: they must match"),
    (_x(), _out(tokens=4), ValueError,
     "out must be (tokens, intermediate) = (3, 64) for x of shape (3, 128), got (4, 64)"),
    (_x(), torch.empty(64, 3, dtype=torch.bfloat16).t(), ValueError,
     "the rows of out must be contiguous"),
    (_x(), torch.empty(3, 68, dtype=torch.bfloat16)[:, :64], ValueError,
     "the row stride of out (68 elements) must be a multiple of 16 bytes"),
    (_x(), torch.empty(3 * 64 + 1, dtype=torch.bfloat16)[1:].view(3, 64), ValueError,
     "out must start 16-byte aligned"),
    # Zero is even and divides 16 bytes: named, not taken for a misaligned row.
    (_x(width=0), None, ValueError, "x's last dim (2 * intermediate) must be positive, got 0"),
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    (_x(), _out().to("meta"), ValueError, "out is on meta but x is on cpu"),
], ids=lambda v: re.sub(r"\W+", "-", v)[:48].strip("-") if isinstance(v, str) else None)
def test_bad_input_is_one_clear_error(op, name, x, out, error, message):
    with pytest.raises(error, match=re.escape(message)):
        op(x, out=out)


def test_padded_rows_pass_every_check():
    # A row stride of 2I + 8 bf16 elements (16 bytes of padding) is accepted.
    x = _x(width=136)[:, :128]
    out = torch.empty(3, 72, dtype=torch.bfloat16)[:, :64]
    silu_and_mul(x, out=out)
    gate, up = x.float().chunk(2, dim=1)
    torch.testing.assert_close(out.float(), torch.nn.functional.silu(gate) * up, rtol=1.6e-2,
                               atol=1e-2)


@pytest.mark.parametrize("approximate", ["exact", "erf", None, "Tanh"])
def test_gelu_form_is_checked_like_torch(approximate):
    with pytest.raises(ValueError,
                       match=re.escape(f"approximate must be one of ('none', 'tanh'), got "
                                       f"{approximate!r}")):
        gelu_and_mul(_x(), approximate)

