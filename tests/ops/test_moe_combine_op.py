"""The public moe_combine op's input checks, tested on CPU tensors (devices are checked last),
and its CPU path (the kernel's fp32 reference)."""

import re

import pytest
import torch

from cutetune.ops.moe_combine import moe_combine

TOKENS, TOP_K, HIDDEN, CAPACITY = 3, 2, 64, 20


def _expert_out(rows=CAPACITY, hidden=HIDDEN, dtype=torch.bfloat16):
    return torch.randn(rows, hidden).to(dtype)


def _row_of(tokens=TOKENS, top_k=TOP_K, dtype=torch.int32):
    return torch.arange(tokens * top_k).view(tokens, top_k).to(dtype)


def _weights(tokens=TOKENS, top_k=TOP_K, dtype=torch.float32):
    return torch.rand(tokens, top_k).to(dtype)


def _out(tokens=TOKENS, hidden=HIDDEN, dtype=torch.bfloat16):
    return torch.empty(tokens, hidden, dtype=dtype)


def _misaligned(rows, hidden, dtype=torch.bfloat16):
    """A (rows, hidden) tensor starting one element past a 16-byte boundary."""
    return torch.empty(rows * hidden + 1, dtype=dtype)[1:].view(rows, hidden)


def _expected(expert_out, row_of, weights):
    capacity = expert_out.shape[0]
    rows = expert_out.float()[row_of.long().clamp(0, capacity - 1)]
    used = (row_of >= 0) & (row_of < capacity)  # other rows add nothing
    return (rows * weights[..., None] * used[..., None]).sum(1)


def test_valid_cpu_inputs_are_combined_with_the_reference():
    row_of = _row_of()
    row_of[1, 0] = -1  # adds nothing
    cases = [(_expert_out(), row_of, _weights(), None),
             (_expert_out(), _row_of(), _weights(), _out()),
             # fp16, a hidden size only 32-bit vectors divide, padded rows, every top-k.
             (_expert_out(hidden=1002, dtype=torch.float16), _row_of(), _weights(),
              _out(hidden=1002, dtype=torch.float16)),
             (_expert_out(hidden=HIDDEN + 8)[:, :HIDDEN], _row_of(), _weights(),
              _out(hidden=HIDDEN + 16)[:, :HIDDEN]),
             *[(_expert_out(), _row_of(top_k=k), _weights(top_k=k), None) for k in (1, 32)]]
    for expert_out, rows, weights, out in cases:
        got = moe_combine(expert_out, rows, weights, out=out)
        assert out is None or got is out
        assert got.dtype == expert_out.dtype
        torch.testing.assert_close(got.float(), _expected(expert_out, rows, weights),
                                   rtol=1.6e-2, atol=2e-2)
    assert moe_combine(_expert_out(), _row_of(tokens=0), _weights(tokens=0)).shape == (0, HIDDEN)
    with pytest.raises(ValueError, match="expert_out is on meta: moe_combine runs on a CUDA "
                                         "device or the CPU"):
        moe_combine(_expert_out().to("meta"), _row_of().to("meta"), _weights().to("meta"))


@pytest.mark.parametrize(("args", "out", "error", "message"), [
    (([1.0], _row_of(), _weights()), None, TypeError,
     "expert_out must be a torch.Tensor, got list"),
    ((_expert_out(), None, _weights()), None, TypeError,
     "row_of must be a torch.Tensor, got NoneType"),
    ((_expert_out(), _row_of(), (0.5, 0.5)), None, TypeError,
     "topk_weights must be a torch.Tensor, got tuple"),
    ((_expert_out(), _row_of(), _weights()), [0.0], TypeError,
     "out must be a torch.Tensor, got list"),
    ((_expert_out(dtype=torch.float32), _row_of(), _weights()), None, TypeError,
     "expert_out has dtype torch.float32: use torch.bfloat16 or torch.float16"),
    ((_expert_out().to(torch.int8), _row_of(), _weights()), None, TypeError,
     "expert_out has dtype torch.int8"),
    ((_expert_out(), _row_of(dtype=torch.int64), _weights()), None, TypeError,
     "row_of has dtype torch.int64: it must be torch.int32"),
    ((_expert_out(), _row_of(), _weights(dtype=torch.bfloat16)), None, TypeError,
     "topk_weights has dtype torch.bfloat16: it must be torch.float32"),
    ((_expert_out()[0], _row_of(), _weights()), None, ValueError,
     "expert_out must be (capacity, hidden), got shape (64,)"),
    ((_expert_out(), _row_of().view(-1), _weights()), None, ValueError,
     "row_of must be (tokens, top_k), got shape (6,)"),
    ((_expert_out(), _row_of(), _weights(top_k=3)), None, ValueError,
     "topk_weights must have row_of's shape (3, 2), got (3, 3)"),
    ((_expert_out(), _row_of(top_k=33), _weights(top_k=33)), None, ValueError,
     "top_k (row_of's second dim) is 33: moe_combine supports 1 to 32"),
    ((_expert_out(), _row_of(top_k=0), _weights(top_k=0)), None, ValueError,
     "top_k (row_of's second dim) is 0"),
    ((_expert_out(hidden=63), _row_of(), _weights()), None, ValueError,
     "hidden size 63 must be positive and even (the narrowest vector is 32 bits, 2 elements "
     "of torch.bfloat16)"),
    ((_expert_out(hidden=0), _row_of(), _weights()), None, ValueError,
     "hidden size 0 must be positive and even"),
    ((_expert_out(), _row_of(tokens=2, top_k=3).t(), _weights()), None, ValueError,
     "row_of and topk_weights must be contiguous"),
    ((_expert_out(), _row_of(), _weights(top_k=3)[:, :2]), None, ValueError,
     "row_of and topk_weights must be contiguous"),
    ((_expert_out(), _row_of(), _weights()), _out(dtype=torch.float16), TypeError,
     "out has dtype torch.float16 but expert_out has torch.bfloat16: they must match"),
    ((_expert_out(), _row_of(), _weights()), _out(tokens=4), ValueError,
     "out must be (tokens, hidden) = (3, 64), got (4, 64)"),
    ((_expert_out(), _row_of(), _weights()), _out(hidden=32), ValueError,
     "out must be (tokens, hidden) = (3, 64), got (3, 32)"),
    ((_expert_out(rows=HIDDEN, hidden=CAPACITY).t(), _row_of(), _weights()), None, ValueError,
     "expert_out and out must have contiguous rows, out's not overlapping (strides (>= 64, 1)), "
     "got expert_out (1, 20)"),
    ((_expert_out(), _row_of(), _weights()), torch.empty(HIDDEN, dtype=torch.bfloat16).expand(
        TOKENS, HIDDEN), ValueError, "got expert_out (64, 1), out (0, 1)"),
    # 64 bf16 elements: 16-byte vectors, so strides and starts aligned to 8 elements.
    ((_expert_out(hidden=HIDDEN + 4)[:, :HIDDEN], _row_of(), _weights()), None, ValueError,
     "expert_out and out must start aligned to 8 elements and their row strides must be "
     "multiples of 8 elements (the widest vector that divides hidden size 64), got strides "
     "expert_out (68, 1)"),
    ((_misaligned(CAPACITY, HIDDEN), _row_of(), _weights()), None, ValueError,
     "must start aligned to 8 elements"),
    ((_expert_out(), _row_of(), _weights()), _misaligned(TOKENS, HIDDEN), ValueError,
     "must start aligned to 8 elements"),
    # 1004 = 251 x 4: 64-bit vectors, so strides aligned to 4 elements.
    ((_expert_out(hidden=1006)[:, :1004], _row_of(), _weights()), None, ValueError,
     "aligned to 4 elements and their row strides must be multiples of 4 elements (the widest "
     "vector that divides hidden size 1004), got strides expert_out (1006, 1)"),
], ids=lambda v: re.sub(r"\W+", "-", v)[:48].strip("-") if isinstance(v, str) else None)
def test_bad_input_is_one_clear_error(args, out, error, message):
    with pytest.raises(error, match=re.escape(message)):
        moe_combine(*args, out=out)


def test_an_out_on_another_device_is_named():
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    with pytest.raises(ValueError, match="out is on meta but expert_out is on cpu"):
        moe_combine(_expert_out(), _row_of(), _weights(), _out().to("meta"))


@pytest.mark.parametrize(("given", "message"), [
    (dict(experts=8.0), "experts must be a positive integer, got 8.0"),
    (dict(experts=True), "experts must be a positive integer, got True"),
    (dict(experts=8, pad=16.0), "pad must be a positive integer, got 16.0"),
    (dict(experts=8, pad=True), "pad must be a positive integer, got True"),
    (dict(experts=8, expert_begin=0.0), "expert_begin must be an integer of at least 0, got 0.0"),
    (dict(experts=8, expert_end=8.0), "expert_end must be a positive integer, got 8.0"),
])
def test_the_dispatch_s_ints_must_be_ints(given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        moe_combine(_expert_out(), _row_of(), _weights(), **given)
