"""The public op's input checks: one clear error before anything launches (tested on CPU
tensors: devices are checked last), and its CPU path (the kernel's torch reference)."""

import pytest
import torch

from cutetune.kernels.moe_dispatch.common import MAX_LOCAL_EXPERTS
from cutetune.ops.moe_dispatch import DispatchResult, moe_dispatch, moe_dispatch_buffers


def inputs(tokens=3, hidden=64, k=2, dtype=torch.bfloat16):
    x = torch.randn(tokens, hidden).to(dtype)
    ids = torch.randint(0, 8, (tokens, k), dtype=torch.int32)
    return x, ids


def misaligned_x():
    flat = torch.zeros(3 * 64 + 8, dtype=torch.bfloat16)
    return flat[1:1 + 3 * 64].view(3, 64)  # contiguous, but 2 bytes past a 16-byte boundary


def test_valid_cpu_inputs_are_dispatched_with_the_reference():
    x, ids = inputs()
    result = moe_dispatch(x.half(), ids, 8, pad=4, expert_range=(2, 6), validate=True)
    local = (ids >= 2) & (ids < 6)
    counts = torch.bincount(ids[local].long() - 2, minlength=4)
    assert result.counts.tolist() == counts.tolist()
    padded = (counts + 3) // 4 * 4
    assert result.offsets.tolist() == [0, *torch.cumsum(padded, 0).tolist()]
    assert torch.equal(result.row_of < 0, ~local)
    for t, k in local.nonzero().tolist():
        assert torch.equal(result.dispatched[result.row_of[t, k]], x[t].half())
    with pytest.raises(ValueError, match="x is on meta: moe_dispatch runs on a CUDA device or "
                                         "the CPU"):
        moe_dispatch(x.to("meta"), ids.to("meta"), 8)


def test_result_is_a_frozen_record_of_the_five_outputs():
    fields = DispatchResult.__dataclass_fields__
    assert list(fields) == ["dispatched", "counts", "offsets", "row_of", "error"]
    result = DispatchResult(*[torch.zeros(1)] * 5)
    with pytest.raises(AttributeError):
        result.counts = None


def test_out_buffers_are_written_and_returned():
    x, ids = inputs()
    allocated = moe_dispatch(x, ids, 8, pad=4, expert_range=(2, 6))
    out = moe_dispatch_buffers(x, ids, 8, pad=4, expert_range=(2, 6))
    assert moe_dispatch(x, ids, 8, pad=4, expert_range=(2, 6), out=out) is out
    for name in ("dispatched", "counts", "offsets", "row_of", "error"):
        assert torch.equal(getattr(out, name), getattr(allocated, name)), name


def test_out_may_hold_more_dispatched_rows_than_the_capacity():
    x, ids = inputs()
    out = moe_dispatch_buffers(x, ids, 8, pad=4)
    larger = DispatchResult(torch.zeros(out.dispatched.shape[0] + 5, 64, dtype=torch.bfloat16),
                            out.counts, out.offsets, out.row_of, out.error)
    result = moe_dispatch(x, ids, 8, pad=4, out=larger)
    assert result is larger
    assert torch.equal(result.dispatched[:out.dispatched.shape[0]],
                       moe_dispatch(x, ids, 8, pad=4).dispatched)


def test_no_tokens_into_used_buffers_clears_counts_offsets_and_the_error_flag():
    x, ids = inputs(tokens=0)
    out = moe_dispatch_buffers(x, ids, 8, pad=4)
    for t in (out.counts, out.offsets, out.error):
        t.fill_(7)
    moe_dispatch(x, ids, 8, pad=4, out=out)
    assert out.counts.tolist() == [0] * 8 and out.offsets.tolist() == [0] * 9
    assert out.error.tolist() == [0]


def _out_with(**changed):
    x, ids = inputs()
    fields = vars(moe_dispatch_buffers(x, ids, 8, pad=4))
    return DispatchResult(**{**fields, **changed})


@pytest.mark.parametrize(("out", "error", "message"), [
    ((1, 2), TypeError, "out must be a DispatchResult"),
    (_out_with(counts=[0] * 8), TypeError, "out.counts must be a torch.Tensor, got list"),
    (_out_with(row_of=torch.zeros(3, 2)), TypeError,
     "out.row_of has dtype torch.float32: it must be torch.int32"),
    (_out_with(offsets=torch.zeros(8, dtype=torch.int32)), ValueError,
     r"out.offsets must have shape \(9,\) for these inputs, got \(8,\)"),
    (_out_with(dispatched=torch.zeros(3 * 2 + 8 * 3 - 1, 64, dtype=torch.bfloat16)), ValueError,
     r"out.dispatched must be \(rows, 64\) with rows >= 30"),
    (_out_with(dispatched=torch.zeros(30, 64, dtype=torch.float16)), TypeError,
     "out.dispatched has dtype torch.float16: it must be torch.bfloat16"),
    (_out_with(dispatched=torch.zeros(64, 30, dtype=torch.bfloat16).t()), ValueError,
     "out.dispatched must be contiguous"),
    (_out_with(error=torch.zeros(1, dtype=torch.int32, device="meta")), ValueError,
     "out.error is on meta but x is on cpu"),
])
def test_bad_out_buffers_are_one_clear_error(out, error, message):
    x, ids = inputs()
    with pytest.raises(error, match=message):
        moe_dispatch(x, ids, 8, pad=4, out=out)


X, IDS = inputs()


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), [
    (([1.0], IDS, 8), {}, TypeError, "x must be a torch.Tensor, got list"),
    ((X, IDS.tolist(), 8), {}, TypeError, "topk_ids must be a torch.Tensor, got list"),
    ((X.float(), IDS, 8), {}, TypeError,
     "x has dtype torch.float32: use torch.bfloat16 or torch.float16"),
    ((X, IDS.long(), 8), {}, TypeError, "topk_ids has dtype torch.int64: use torch.int32"),
    ((X[None], IDS, 8), {}, ValueError, r"x must be \(tokens, hidden\), got shape \(1, 3, 64\)"),
    ((X, IDS[:2], 8), {}, ValueError,
     r"topk_ids must be \(tokens, top_k\) with x's 3 tokens, got shape \(2, 2\)"),
    ((X, IDS.flatten(), 8), {}, ValueError, r"topk_ids must be \(tokens, top_k\)"),
    ((X, torch.zeros(3, 9, dtype=torch.int32), 8), {}, ValueError,
     r"top_k 9 \(topk_ids.shape\[1\]\) must be between 1 and num_experts 8"),
    ((X, IDS, 0), {}, ValueError, "num_experts must be a positive integer, got 0"),
    ((X, IDS, 8.0), {}, ValueError, "num_experts must be a positive integer, got 8.0"),
    ((X, IDS, True), {}, ValueError, "num_experts must be a positive integer, got True"),
    ((X, IDS, 8), {"pad": 0}, ValueError, "pad must be a positive integer, got 0"),
    ((X, IDS, 8), {"zero_padding": 1}, TypeError, "zero_padding must be True or False, got 1"),
    # Read as truthy, 'no' would synchronise and check the flag.
    ((X, IDS, 8), {"validate": "no"}, TypeError, "validate must be True or False, got 'no'"),
    # Zero is a multiple of 4 bytes: named, not taken for a valid width.
    ((torch.zeros(3, 0, dtype=torch.bfloat16), IDS, 8), {}, ValueError,
     r"hidden \(x.shape\[1\]\) must be positive, got 0"),
    # get_device() is -1 for meta and CPU alike: the devices themselves are compared.
    ((X, IDS.to("meta"), 8), {}, ValueError, "topk_ids is on meta but x is on cpu"),
    ((X, IDS, 8), {"expert_range": (4, 4)}, ValueError,
     r"expert_range \[4, 4\) must be a non-empty range within \[0, 8\)"),
    ((X, IDS, 8), {"expert_range": (-1, 4)}, ValueError, r"expert_range \[-1, 4\)"),
    ((X, IDS, 8), {"expert_range": (0, 9)}, ValueError, r"expert_range \[0, 9\)"),
    ((X, IDS, 8), {"expert_range": (0, 2, 4)}, ValueError,
     r"expert_range must be a \(begin, end\) pair of ints, got \(0, 2, 4\)"),
    ((X, IDS, 8), {"expert_range": (0.0, 4)}, ValueError, "expert_range must be a"),
    ((X, IDS, 8), {"expert_range": 4}, ValueError, "expert_range must be a"),
    ((X, IDS, 4096), {}, ValueError,
     f"4096 local experts: moe_dispatch supports at most {MAX_LOCAL_EXPERTS}"),
    ((torch.zeros(3, 63, dtype=torch.bfloat16), IDS, 8), {}, ValueError,
     "hidden 63 must be a multiple of 4 bytes"),
    ((X.t().contiguous().t(), IDS, 8), {}, ValueError, "x must be contiguous"),
    ((X, IDS.t().contiguous().t(), 8), {}, ValueError, "topk_ids must be contiguous"),
    ((misaligned_x(), IDS, 8), {}, ValueError, "x must start 16-byte aligned"),
])
def test_bad_input_is_one_clear_error(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        moe_dispatch(*args, **kwargs)


def test_a_local_range_of_many_experts_is_fine_up_to_the_limit():
    x, ids = inputs()
    # 4096 experts, 1024 of them local: every check passes (no pair is local).
    result = moe_dispatch(x, ids, 4096, expert_range=(1024, 2048))
    assert result.counts.shape == (1024,) and int(result.counts.sum()) == 0
    assert bool((result.row_of == -1).all())
