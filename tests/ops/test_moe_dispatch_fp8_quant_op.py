"""cutetune.moe_dispatch_fp8_quant's own checks (those of the quantisation and of its `out`;
the routing's are moe_dispatch's, tested there): one clear error before anything launches
(tested on CPU tensors: devices are checked last), and its CPU path (the kernel's torch
reference): the bytes moe_dispatch followed by fp8_group_quant of its rows writes."""

import re

import pytest
import torch

from cutetune.ops.fp8_quant import fp8_group_quant
from cutetune.ops.moe_dispatch import moe_dispatch
from cutetune.ops.moe_dispatch_fp8_quant import (
    DispatchFP8Result,
    moe_dispatch_fp8_quant,
    moe_dispatch_fp8_quant_buffers,
)


def inputs(tokens=5, hidden=256, k=2):
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 8, (tokens, k), dtype=torch.int32,
                        generator=torch.Generator().manual_seed(1))
    return x.to(torch.bfloat16), ids


@pytest.mark.parametrize("column_major, ue8m0, group", [(False, False, 128), (True, True, 64)])
def test_cpu_calls_write_moe_dispatch_then_fp8_group_quant_of_its_rows(column_major, ue8m0,
                                                                        group):
    x, ids = inputs()
    quant = {"group_size": group, "column_major_scales": column_major, "ue8m0": ue8m0}
    result = moe_dispatch_fp8_quant(x, ids, 8, pad=4, expert_range=(2, 6), zero_padding=True,
                                    **quant)
    dispatched = moe_dispatch(x, ids, 8, pad=4, expert_range=(2, 6), zero_padding=True)
    q, scales = fp8_group_quant(dispatched.dispatched, **quant)
    for name in ("counts", "offsets", "row_of", "error"):
        assert torch.equal(getattr(result, name), getattr(dispatched, name)), name
    assert torch.equal(result.q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(result.scales, scales)
    assert result.scales.stride() == scales.stride()  # the same layout, padded alike


def test_result_is_a_frozen_record_of_the_six_outputs():
    assert list(DispatchFP8Result.__dataclass_fields__) == [
        "q", "scales", "counts", "offsets", "row_of", "error"]
    with pytest.raises(AttributeError):
        DispatchFP8Result(*[torch.zeros(1)] * 6).q = None


def test_out_buffers_are_written_and_returned_and_may_hold_more_rows():
    x, ids = inputs()
    allocated = moe_dispatch_fp8_quant(x, ids, 8, pad=4, column_major_scales=True)
    out = moe_dispatch_fp8_quant_buffers(x, ids, 8, pad=4, column_major_scales=True)
    assert out.scales.stride() == allocated.scales.stride()
    assert moe_dispatch_fp8_quant(x, ids, 8, pad=4, column_major_scales=True, out=out) is out
    assert torch.equal(out.q.view(torch.uint8), allocated.q.view(torch.uint8))
    assert torch.equal(out.scales, allocated.scales)
    rows = out.q.shape[0]
    larger = DispatchFP8Result(torch.zeros(rows + 3, 256, dtype=torch.float8_e4m3fn),
                               torch.zeros(rows + 3, 2), out.counts, out.offsets, out.row_of,
                               out.error)
    moe_dispatch_fp8_quant(x, ids, 8, pad=4, out=larger)
    assert torch.equal(larger.q[:rows].view(torch.uint8), allocated.q.view(torch.uint8))


def test_no_tokens_clear_counts_offsets_and_the_error_flag():
    x, ids = inputs(tokens=0)
    out = moe_dispatch_fp8_quant_buffers(x, ids, 8, pad=4)
    for t in (out.counts, out.offsets, out.error):
        t.fill_(7)
    moe_dispatch_fp8_quant(x, ids, 8, pad=4, out=out)
    assert out.counts.tolist() == [0] * 8 and out.error.tolist() == [0]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"group_size": 32}, ValueError, "group_size must be an int among"),
    ({"group_size": True}, ValueError, "group_size must be an int among"),
    ({"ue8m0": 1}, TypeError, "ue8m0 must be True or False"),
    ({"column_major_scales": None}, TypeError, "column_major_scales must be True or False"),
    ({"zero_padding": "yes"}, TypeError, "zero_padding must be True or False"),
    # 128.0 == 128, but a float size would reach torch.empty.
    ({"group_size": 128.0}, ValueError, "group_size must be an int among (64, 128), got 128.0"),
    ({"validate": "no"}, TypeError, "validate must be True or False, got 'no'"),
])
def test_bad_quantisation_arguments_get_one_clear_error(kwargs, error, message):
    x, ids = inputs()
    with pytest.raises(error, match=re.escape(message)):
        moe_dispatch_fp8_quant(x, ids, 8, **kwargs)


def test_the_buffers_take_an_int_group_size():
    x, ids = inputs()
    with pytest.raises(ValueError, match=re.escape("group_size must be an int among (64, 128), "
                                                   "got 128.0")):
        moe_dispatch_fp8_quant_buffers(x, ids, 8, group_size=128.0)


def test_hidden_must_split_into_groups_and_the_routing_checks_are_moe_dispatchs():
    x, ids = inputs(hidden=192)
    with pytest.raises(ValueError, match="hidden 192 must be a multiple of group_size 128"):
        moe_dispatch_fp8_quant(x, ids, 8)
    moe_dispatch_fp8_quant(x, ids, 8, group_size=64)
    with pytest.raises(TypeError, match="topk_ids has dtype torch.int64: use torch.int32"):
        moe_dispatch_fp8_quant(x, ids.long(), 8)
    with pytest.raises(ValueError, match="x is on meta"):
        moe_dispatch_fp8_quant(x.to("meta"), ids.to("meta"), 8)


def _out_with(**changed):
    x, ids = inputs()
    fields = vars(moe_dispatch_fp8_quant_buffers(x, ids, 8, pad=4))
    return x, ids, DispatchFP8Result(**{**fields, **changed})


@pytest.mark.parametrize("changed, error, message", [
    ({"q": torch.zeros(3, 256, dtype=torch.float8_e4m3fn)}, ValueError,
     r"out.q must be \(rows, 256\) with rows >= 34"),
    ({"q": torch.zeros(34, 256, dtype=torch.bfloat16)}, TypeError,
     "out.q has dtype torch.bfloat16: it must be torch.float8_e4m3fn"),
    ({"scales": torch.zeros(33, 2)}, ValueError, r"out.scales must have shape \(34, 2\)"),
    ({"scales": torch.zeros(2, 34).t()}, ValueError, "out.scales must be row-major"),
    ({"scales": torch.zeros(34, 2, dtype=torch.float16)}, TypeError,
     "out.scales has dtype torch.float16"),
    ({"counts": torch.zeros(7, dtype=torch.int32)}, ValueError, r"out.counts must have shape"),
    ({"row_of": None}, TypeError, "out.row_of must be a torch.Tensor"),
])
def test_out_buffers_that_do_not_fit_get_one_clear_error(changed, error, message):
    x, ids, out = _out_with(**changed)
    with pytest.raises(error, match=message):
        moe_dispatch_fp8_quant(x, ids, 8, pad=4, out=out)


def test_column_major_out_scales_must_be_column_major():
    x, ids = inputs()
    out = moe_dispatch_fp8_quant_buffers(x, ids, 8, pad=4)  # row-major
    with pytest.raises(ValueError, match="out.scales must be column-major"):
        moe_dispatch_fp8_quant(x, ids, 8, pad=4, column_major_scales=True, out=out)
    with pytest.raises(TypeError, match="out must be a DispatchFP8Result"):
        moe_dispatch_fp8_quant(x, ids, 8, pad=4, out=vars(out))
