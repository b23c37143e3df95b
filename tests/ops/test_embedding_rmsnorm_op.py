"""cutetune.embedding_rmsnorm on the CPU: every bad input refused with one line naming the
argument before anything touches a GPU, and the CPU path (the kernel's reference) written as
the kernel writes: the looked-up rows (scaled as Gemma scales them) into residual, their norm
into out, zeros and the flag for bad ids."""

import re

import pytest
import torch

import cutetune

VOCAB, HIDDEN = 40, 64


def _table(rows=VOCAB, dtype=torch.bfloat16):
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(0)).to(dtype)


def _norm_weight(dtype=torch.bfloat16):
    return (1 + 0.5 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(1))).to(dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, bias: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (weight.float() + bias)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("ids_dtype", (torch.int32, torch.int64))
def test_llama_s_embedding_then_input_layernorm(dtype, ids_dtype):
    weight, norm_weight = _table(dtype=dtype), _norm_weight(dtype)
    ids = torch.tensor([3, 0, 39, 3, 17], dtype=ids_dtype)
    out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight, eps=1e-5)
    assert out.dtype is residual.dtype is dtype and out.shape == residual.shape == (5, HIDDEN)
    rows = torch.nn.functional.embedding(ids, weight)
    assert torch.equal(residual, rows)
    assert torch.equal(out, _rms_norm(rows, norm_weight, 1e-5, 0.0).to(dtype))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_gemma_s_scaled_embedding_then_input_layernorm(dtype):
    """The normaliser sqrt(hidden) as Gemma applies it: rounded to the dtype, the product
    rounded too; the norm scales by (1 + w)."""
    weight, norm_weight = _table(dtype=dtype), _norm_weight(dtype)
    ids = torch.tensor([5, 6, 7])
    out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight, weight_bias=1.0,
                                               embed_scale=HIDDEN**0.5 + 0.01)
    scaled = torch.nn.functional.embedding(ids, weight) * torch.tensor(
        HIDDEN**0.5 + 0.01).to(dtype)
    assert torch.equal(residual, scaled)
    assert torch.equal(out, _rms_norm(scaled, norm_weight, 1e-6, 1.0).to(dtype))


@pytest.mark.parametrize("bad", (-1, VOCAB, 2**32))
def test_a_bad_id_raises_the_flag_and_gets_zero_rows(bad):
    error = torch.zeros(1, dtype=torch.int32)
    weight = _table()
    out, residual = cutetune.embedding_rmsnorm(torch.tensor([12, bad]), weight, _norm_weight(),
                                               error=error)
    assert error.tolist() == [1]
    assert torch.equal(residual[0], weight[12])
    assert torch.equal(residual[1], torch.zeros(HIDDEN, dtype=torch.bfloat16))
    assert torch.equal(out[1], torch.zeros(HIDDEN, dtype=torch.bfloat16))


def test_a_padded_table_flags_ids_past_the_vocabulary():
    """vLLM pads its table: rows past vocab_size are never read, their ids flagged."""
    error = torch.zeros(1, dtype=torch.int32)
    weight = _table(rows=48)
    _, residual = cutetune.embedding_rmsnorm(torch.tensor([39, 40]), weight, _norm_weight(),
                                             vocab_size=VOCAB, error=error)
    assert error.tolist() == [1]
    assert torch.equal(residual[0], weight[39])
    assert torch.equal(residual[1], torch.zeros(HIDDEN, dtype=torch.bfloat16))


def test_the_flag_is_never_cleared_by_the_op():
    error = torch.zeros(1, dtype=torch.int32)
    weight, norm_weight = _table(), _norm_weight()
    cutetune.embedding_rmsnorm(torch.tensor([1, 2]), weight, norm_weight, error=error)
    assert error.tolist() == [0]
    cutetune.embedding_rmsnorm(torch.tensor([-5]), weight, norm_weight, error=error)
    cutetune.embedding_rmsnorm(torch.tensor([1, 2]), weight, norm_weight, error=error)
    assert error.tolist() == [1]


def test_into_residual_and_out():
    weight, norm_weight = _table(), _norm_weight()
    residual = torch.full((2, HIDDEN), float("nan"), dtype=torch.bfloat16)
    out = torch.zeros(2, 2 * HIDDEN, dtype=torch.bfloat16)[:, :HIDDEN]  # a padded row stride
    got = cutetune.embedding_rmsnorm(torch.tensor([4, 5]), weight, norm_weight,
                                     residual=residual, out=out)
    assert got[0] is out and got[1] is residual
    assert torch.equal(residual, weight[4:6])
    assert torch.equal(out, _rms_norm(weight[4:6], norm_weight, 1e-6, 0.0).bfloat16())


def test_no_tokens_is_nothing_to_do():
    out, residual = cutetune.embedding_rmsnorm(torch.tensor([], dtype=torch.int64), _table(),
                                               _norm_weight())
    assert out.shape == residual.shape == (0, HIDDEN)


def _inputs():
    return (torch.tensor([1, 2, 3]), _table(), _norm_weight(), None, None, None)


@pytest.mark.parametrize(("mutate", "error", "message"), [
    # The table, ids, out and error: as cutetune.embedding checks them.
    (lambda i, w, n, r, o, e: ([1, 2], w, n, r, o, e), TypeError,
     "ids must be a torch.Tensor, got list"),
    (lambda i, w, n, r, o, e: (i, w.tolist(), n, r, o, e), TypeError,
     "weight must be a torch.Tensor, got list"),
    (lambda i, w, n, r, o, e: (i.short(), w, n, r, o, e), TypeError,
     "ids has dtype torch.int16: use torch.int32 or torch.int64"),
    (lambda i, w, n, r, o, e: (i, w.double(), n, r, o, e), TypeError,
     "weight has dtype torch.float64: use one of torch.bfloat16"),
    (lambda i, w, n, r, o, e: (i, w.flatten()[2:2 + 39 * HIDDEN].view(39, HIDDEN), n, r, o, e),
     ValueError, "weight must start 16-byte aligned"),
    (lambda i, w, n, r, o, e: (i, w, n, r, torch.empty(3, HIDDEN), e), TypeError,
     "out has dtype torch.float32 but weight has torch.bfloat16"),
    (lambda i, w, n, r, o, e: (i, w, n, r, o, torch.zeros(1)), TypeError,
     "error must be a (1,) torch.int32 tensor, got torch.float32 of shape (1,)"),
    # The width: rmsnorm's.
    (lambda i, w, n, r, o, e: (i, w[:, :32].contiguous(), n[:32], r, o, e), ValueError,
     "hidden 32 (weight.shape[1]) is not supported: use 64 to 16384"),
    # residual as out.
    (lambda i, w, n, r, o, e: (i, w, n, "residual", o, e), TypeError,
     "residual must be a torch.Tensor, got str"),
    (lambda i, w, n, r, o, e: (i, w, n, torch.empty(3, HIDDEN, dtype=torch.float16), o, e),
     TypeError, "residual has dtype torch.float16 but weight has torch.bfloat16"),
    (lambda i, w, n, r, o, e: (i, w, n, torch.empty(3, 2 * HIDDEN, dtype=torch.bfloat16), o,
                               e), ValueError,
     "residual must be (tokens, hidden) = (3, 64), got (3, 128)"),
    (lambda i, w, n, r, o, e: (i, w, n, torch.empty(HIDDEN, 3, dtype=torch.bfloat16).t(), o,
                               e), ValueError, "the rows of residual must be contiguous"),
    (lambda i, w, n, r, o, e: (i, w, n, torch.empty(3, HIDDEN, dtype=torch.bfloat16,
                                                    device="meta"), o, e), ValueError,
     "residual is on meta but weight is on cpu"),
    # The norm's weight.
    (lambda i, w, n, r, o, e: (i, w, n.tolist(), r, o, e), TypeError,
     "norm_weight must be a torch.Tensor, got list"),
    (lambda i, w, n, r, o, e: (i, w, n.float(), r, o, e), TypeError,
     "norm_weight has dtype torch.float32 but weight has torch.bfloat16: they must match"),
    (lambda i, w, n, r, o, e: (i, w, n[:32], r, o, e), ValueError,
     "norm_weight must be a contiguous (64,) vector, got shape (32,)"),
    (lambda i, w, n, r, o, e: (i, w, n.repeat(2)[::2], r, o, e), ValueError,
     "norm_weight must be a contiguous (64,) vector, got shape (64,) and strides (2,)"),
    (lambda i, w, n, r, o, e: (i, w, n.repeat(2)[1:1 + HIDDEN], r, o, e), ValueError,
     "norm_weight must start 16-byte aligned"),
    (lambda i, w, n, r, o, e: (i, w, n.to("meta"), r, o, e), ValueError,
     "norm_weight is on meta but weight is on cpu"),
])
def test_bad_input_is_one_line_naming_the_argument(mutate, error, message):
    ids, weight, norm_weight, residual, out, flag = mutate(*_inputs())
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.embedding_rmsnorm(ids, weight, norm_weight, residual=residual, out=out,
                                   error=flag)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(vocab_start=10, vocab_end=40, vocab_size=40), ValueError,
     "embedding_rmsnorm normalises whole rows, so it takes the whole vocabulary [0, 40), got "
     "[10, 40): a vocab-parallel rank runs cutetune.embedding, the all-reduce, then "
     "cutetune.rmsnorm"),
    (dict(vocab_end=20), ValueError, "the whole vocabulary [0, 40), got [0, 20)"),
    (dict(vocab_start=-1), ValueError, "[vocab_start, vocab_end) must be a non-empty range"),
    (dict(vocab_size=2**31), ValueError, "vocab_size 2147483648 must be below 2^31"),
    (dict(vocab_size="40"), TypeError, "vocab_size must be an int, got '40'"),
    (dict(eps=0.0), ValueError, "eps must be a finite number above 0, got 0.0"),
    (dict(eps=float("inf")), ValueError, "eps must be a finite number above 0, got inf"),
    (dict(embed_scale=float("inf")), ValueError, "embed_scale must be finite, got inf"),
    (dict(weight_bias=0.5), ValueError, "weight_bias must be 0 or 1"),
    (dict(embed_scale="8"), TypeError, "embed_scale must be a float, got '8'"),
    (dict(embed_scale=-8.0), ValueError, "embed_scale must be a positive value of bfloat16"),
])
def test_bad_scalars_are_one_line_naming_the_argument(arguments, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.embedding_rmsnorm(torch.tensor([1]), _table(), _norm_weight(), **arguments)
    assert "\n" not in str(info.value)


class FirstLayerInput(torch.nn.Module):
    def forward(self, ids, weight, norm_weight, error):
        out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight, error=error)
        return out * 2, residual


def test_torch_export_traces_the_mutating_custom_op():
    ids, weight, norm_weight = torch.tensor([12, 3, -1, 29]), _table(), _norm_weight()
    error = torch.zeros(1, dtype=torch.int32)
    exported = torch.export.export(FirstLayerInput(), (ids, weight, norm_weight, error))
    names = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert any("cutetune.embedding_rmsnorm" in name for name in names), names
    schema = torch.ops.cutetune.embedding_rmsnorm.default._schema
    assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == {
        "residual", "out", "error"}
    got = exported.module()(ids, weight, norm_weight, error)
    expected = FirstLayerInput()(ids, weight, norm_weight, torch.zeros(1, dtype=torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert error.tolist() == [1]
