"""cutetune.embedding on the CPU: every bad input refused with one line naming the argument
before anything touches a GPU, and the CPU path (the kernel's reference) written as the kernel
writes: this rank's rows, zeros for other ranks' ids, the flag raised for bad ids and never
cleared."""

import re

import pytest
import torch

import cutetune

VOCAB, HIDDEN = 40, 16


def _table(rows=VOCAB, dtype=torch.bfloat16):
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("ids_dtype", (torch.int32, torch.int64))
def test_one_gpus_table_is_torchs_embedding(dtype, ids_dtype):
    weight = _table(dtype=dtype)
    ids = torch.tensor([3, 0, 39, 3, 17], dtype=ids_dtype)
    out = cutetune.embedding(ids, weight)
    assert out.dtype is dtype and out.shape == (5, HIDDEN)
    assert torch.equal(out, torch.nn.functional.embedding(ids, weight))


def test_ranks_give_zero_rows_for_others_ids_and_sum_to_the_table():
    whole = _table()
    ids = torch.tensor([0, 9, 10, 39, 25, 10], dtype=torch.int64)
    outs = [cutetune.embedding(ids, whole[start:end], start, end, VOCAB)
            for start, end in ((0, 10), (10, 30), (30, 40))]
    assert torch.equal(outs[1][0], torch.zeros(HIDDEN, dtype=torch.bfloat16))
    assert torch.equal(outs[1][2], whole[10])
    total = sum(out.float() for out in outs)
    assert torch.equal(total, torch.nn.functional.embedding(ids, whole).float())


def test_a_padded_shard_reads_its_range_only():
    shard = _table(rows=24)  # ids [10, 30) and four padding rows
    out = cutetune.embedding(torch.tensor([29, 30, 33]), shard, 10, 30, VOCAB)
    assert torch.equal(out[0], shard[19])
    assert torch.equal(out[1:], torch.zeros(2, HIDDEN, dtype=torch.bfloat16))


@pytest.mark.parametrize("bad", (-1, VOCAB, 2**32 + 10))
def test_an_id_outside_the_vocabulary_raises_the_flag_and_gets_a_zero_row(bad):
    error = torch.zeros(1, dtype=torch.int32)
    shard = _table(rows=20)
    out = cutetune.embedding(torch.tensor([12, bad]), shard, 10, 30, VOCAB, error=error)
    assert error.tolist() == [1]
    assert torch.equal(out[0], shard[2])
    assert torch.equal(out[1], torch.zeros(HIDDEN, dtype=torch.bfloat16))


def test_the_flag_is_never_cleared_by_the_op():
    error = torch.zeros(1, dtype=torch.int32)
    weight = _table()
    cutetune.embedding(torch.tensor([1, 2]), weight, error=error)
    assert error.tolist() == [0]
    cutetune.embedding(torch.tensor([-5]), weight, error=error)
    cutetune.embedding(torch.tensor([1, 2]), weight, error=error)
    assert error.tolist() == [1]


def test_an_id_of_the_range_past_a_short_table_is_flagged():
    error = torch.zeros(1, dtype=torch.int32)
    out = cutetune.embedding(torch.tensor([14]), _table(rows=4), 10, 30, VOCAB, error=error)
    assert error.tolist() == [1]
    assert torch.equal(out[0], torch.zeros(HIDDEN, dtype=torch.bfloat16))


def test_into_out():
    weight = _table()
    out = torch.full((2, HIDDEN), float("nan"), dtype=torch.bfloat16)
    assert cutetune.embedding(torch.tensor([4, 5]), weight, out=out) is out
    assert torch.equal(out, weight[4:6])


def test_a_padded_out_row_stride_passes():
    weight = _table()
    out = torch.zeros(2, 2 * HIDDEN, dtype=torch.bfloat16)[:, :HIDDEN]
    cutetune.embedding(torch.tensor([4, 5]), weight, out=out)
    assert torch.equal(out, weight[4:6])


def test_no_tokens_is_nothing_to_do():
    out = cutetune.embedding(torch.tensor([], dtype=torch.int64), _table())
    assert out.shape == (0, HIDDEN)


def _inputs():
    return (torch.tensor([1, 2, 3]), _table(), None, None)


@pytest.mark.parametrize(("mutate", "error", "message"), [
    (lambda i, w, o, e: ([1, 2], w, o, e), TypeError, "ids must be a torch.Tensor, got list"),
    (lambda i, w, o, e: (i, w.tolist(), o, e), TypeError,
     "weight must be a torch.Tensor, got list"),
    (lambda i, w, o, e: (i.short(), w, o, e), TypeError,
     "ids has dtype torch.int16: use torch.int32 or torch.int64"),
    (lambda i, w, o, e: (i.float(), w, o, e), TypeError, "ids has dtype torch.float32"),
    (lambda i, w, o, e: (i, w.double(), o, e), TypeError,
     "weight has dtype torch.float64: use one of torch.bfloat16"),
    (lambda i, w, o, e: (i[:, None], w, o, e), ValueError,
     "ids must be a contiguous (tokens,) tensor, got shape (3, 1)"),
    (lambda i, w, o, e: (i.repeat(2)[::2], w, o, e), ValueError,
     "ids must be a contiguous (tokens,) tensor"),
    (lambda i, w, o, e: (i, w[0], o, e), ValueError,
     "weight must be a (rows, hidden) table of at least one row, got shape (16,)"),
    (lambda i, w, o, e: (i, w[:, :3].contiguous(), o, e), ValueError,
     "hidden 3 (weight.shape[1]) must be a multiple of 4 bytes (2 elements of torch.bfloat16)"),
    (lambda i, w, o, e: (i, w.t().contiguous().t(), o, e), ValueError,
     "the rows of weight must be contiguous"),
    (lambda i, w, o, e: (i, torch.zeros(40, 20, dtype=torch.bfloat16)[:, :HIDDEN], o, e),
     ValueError, "the row stride of weight (20 elements) must be hidden (16) or a multiple"),
    (lambda i, w, o, e: (i, w.flatten()[2:2 + 39 * HIDDEN].view(39, HIDDEN), o, e),
     ValueError, "weight must start 16-byte aligned"),
    (lambda i, w, o, e: (i, w, torch.empty(3, HIDDEN), e), TypeError,
     "out has dtype torch.float32 but weight has torch.bfloat16"),
    (lambda i, w, o, e: (i, w, torch.empty(2, HIDDEN, dtype=torch.bfloat16), e), ValueError,
     "out must be (tokens, hidden) = (3, 16), got (2, 16)"),
    (lambda i, w, o, e: (i, w, "out", e), TypeError, "out must be a torch.Tensor, got str"),
    (lambda i, w, o, e: (i, w, o, torch.zeros(1)), TypeError,
     "error must be a (1,) torch.int32 tensor, got torch.float32 of shape (1,)"),
    (lambda i, w, o, e: (i, w, o, torch.zeros(2, dtype=torch.int32)), TypeError,
     "error must be a (1,) torch.int32 tensor"),
    (lambda i, w, o, e: (i.to("meta"), w, o, e), ValueError, "ids is on meta but weight is on cpu"),
    (lambda i, w, o, e: (i, w.to("meta"), o, e), ValueError,
     "weight is on meta: embedding runs on a CUDA device or the CPU"),
])
def test_bad_input_is_one_line_naming_the_argument(mutate, error, message):
    ids, weight, out, flag = mutate(*_inputs())
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.embedding(ids, weight, out=out, error=flag)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("vocab", "error", "message"), [
    (dict(vocab_start=-1), ValueError, "[vocab_start, vocab_end) must be a non-empty range "
                                       "within [0, vocab_size): got [-1, 39) and vocab_size 39"),
    (dict(vocab_start=10, vocab_end=10), ValueError, "got [10, 10) and vocab_size 10"),
    (dict(vocab_start=10, vocab_end=30, vocab_size=20), ValueError,
     "got [10, 30) and vocab_size 20"),
    (dict(vocab_start=True), TypeError, "vocab_start must be an int, got True"),
    (dict(vocab_start="0"), TypeError, "vocab_start must be an int, got '0'"),
    (dict(vocab_end=40.0), TypeError, "vocab_end must be an int, got 40.0"),
    (dict(vocab_size=2**31), ValueError, "vocab_size 2147483648 must be below 2^31"),
])
def test_bad_vocabulary_is_one_line_naming_the_argument(vocab, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.embedding(torch.tensor([1]), _table(), **vocab)
    assert "\n" not in str(info.value)


class Lookup(torch.nn.Module):
    def forward(self, ids, weight, error):
        return cutetune.embedding(ids, weight, 10, 30, VOCAB, error=error) * 2


def test_torch_export_traces_the_mutating_custom_op():
    ids, shard = torch.tensor([12, 3, -1, 29]), _table(rows=20)
    error = torch.zeros(1, dtype=torch.int32)
    exported = torch.export.export(Lookup(), (ids, shard, error))
    names = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert any("cutetune.embedding" in name for name in names), names
    schema = torch.ops.cutetune.embedding.default._schema
    assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == {
        "out", "error"}
    (result,) = exported.graph.output_node().args[0]
    assert tuple(result.meta["val"].shape) == (4, HIDDEN)
    got = exported.module()(ids, shard, error)
    assert torch.equal(got, Lookup()(ids, shard, torch.zeros(1, dtype=torch.int32)))
    assert error.tolist() == [1]
