"""cutetune.moe_dispatch_fp8_quant: the token shuffle of a local MoE layer, writing the rows in
FP8 with their per-group scales (what a block-scaled grouped GEMM of the experts reads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cutetune.fast_call import Dim, DType, FastCall, RowsPerToken, Value
from cutetune.kernels.fp8_group_quant import kernel_scales
from cutetune.kernels.fp8_quant import FP8_DTYPE, empty_scales
from cutetune.kernels.moe_common import dispatch_capacity
from cutetune.kernels.moe_dispatch_fp8_quant import KERNEL, MoEDispatchFP8QuantProblem
from cutetune.ops import moe_dispatch as dispatch_op
from cutetune.ops.checks import check_bool
from cutetune.ops.fp8_quant import check_quant_scalars
from cutetune.ops.registry import Checked, CustomOp, OpDef, register


@dataclass(frozen=True)
class DispatchFP8Result:
    """q (capacity, hidden) float8_e4m3fn: each local expert's tokens quantised in its padded
    segment; scales (capacity, hidden / group_size) fp32, row-major or column-major; counts,
    offsets, row_of and error as moe_dispatch's DispatchResult has them."""

    q: torch.Tensor
    scales: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    row_of: torch.Tensor
    error: torch.Tensor


def moe_dispatch_fp8_quant_buffers(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                                   pad: int = 16,
                                   expert_range: tuple[int, int] | None = None,
                                   group_size: int = 128, column_major_scales: bool = False
                                   ) -> DispatchFP8Result:
    """The output buffers of `moe_dispatch_fp8_quant` for inputs of x's and topk_ids' sizes and
    device: allocate them once (for a CUDA graph's batch, say) and pass them as its `out`."""
    _, begin, end, _ = dispatch_op._check_inputs(x, topk_ids, num_experts, pad, expert_range)
    _check_quant(x, group_size, column_major_scales, False)
    return _allocate(x, topk_ids.shape[1], end - begin, pad, group_size, column_major_scales)


def _check_quant(x: torch.Tensor, group_size: object, column_major_scales: object,
                 ue8m0: object) -> None:
    check_quant_scalars(group_size, column_major_scales, ue8m0)
    if x.shape[1] % group_size:
        raise ValueError(f"hidden {x.shape[1]} must be a multiple of group_size {group_size}")


def moe_dispatch_fp8_quant(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                           pad: int = 16, expert_range: tuple[int, int] | None = None,
                           validate: bool = False, zero_padding: bool = False,
                           group_size: int = 128, column_major_scales: bool = False,
                           ue8m0: bool = False, out: DispatchFP8Result | None = None
                           ) -> DispatchFP8Result:
    """`cutetune.moe_dispatch` with each row written quantised to FP8 e4m3, with one fp32 scale
    per group of `group_size` (64 or 128) elements, as `cutetune.fp8_group_quant` quantises
    (column_major_scales, ue8m0 alike): the bytes moe_dispatch followed by fp8_group_quant of
    its rows writes, each token read once and quantised once in one call. With zero_padding
    the padding rows are zero codes with an all-zero group's scale; otherwise they, and their
    scales, are left as they were.

    The routing, expert_range, validate, the workspace and `out` (made by
    `moe_dispatch_fp8_quant_buffers`; out.q and out.scales may have more rows than the capacity
    needs, the same number each) are moe_dispatch's. On CPU tensors the op computes with the
    kernel's torch reference. Under torch.compile the call is the custom op
    cutetune::moe_dispatch_fp8_quant (cutetune::moe_dispatch_fp8_quant_into with `out`)."""
    return dispatch_op._validated(_MOE_DISPATCH_FP8_QUANT((
        x, topk_ids, num_experts, pad, expert_range, validate, zero_padding, group_size,
        column_major_scales, ue8m0, out)), validate, num_experts)


def _route_arguments(x, topk_ids, result: DispatchFP8Result, workspace, num_experts, pad,
                     begin, end, zero_padding, group_size, column_major, ue8m0) -> tuple:
    return (x, topk_ids, result.row_of, result.q, kernel_scales(result.scales, column_major),
            result.counts, result.offsets, result.error, workspace, num_experts, pad, begin,
            end, zero_padding, group_size, column_major, ue8m0)


def _prepared(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding, group_size,
              column_major, ue8m0, out) -> tuple[tuple | None, DispatchFP8Result | None]:
    """The route's arguments, the outputs allocated where out is None; none on the CPU (the
    workspace is a CUDA tensor)."""
    device = x.get_device()
    if device < 0:
        return None, None
    begin, end = (0, num_experts) if expert_range is None else expert_range
    if out is None:
        out = _allocate(x, topk_ids.shape[1], end - begin, pad, group_size, column_major)
    return _route_arguments(x, topk_ids, out, dispatch_op._workspace(device, end - begin),
                            num_experts, pad, begin, end, zero_padding, group_size,
                            column_major, ue8m0), out


def _checked(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding, group_size,
             column_major, ue8m0, out, allocated) -> Checked:
    check_bool("zero_padding", zero_padding)
    check_bool("validate", validate)
    dtype, begin, end, device = dispatch_op._check_inputs(x, topk_ids, num_experts, pad,
                                                          expert_range)
    _check_quant(x, group_size, column_major, ue8m0)
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    if out is not None:
        result = _checked_out(out, x, top_k, end - begin, pad, group_size, column_major)
    elif allocated is not None:
        result = allocated
    else:
        result = _allocate(x, top_k, end - begin, pad, group_size, column_major)
    if tokens == 0:
        result.counts.zero_()
        result.offsets.zero_()
        result.error.zero_()
        return Checked(result)
    static = MoEDispatchFP8QuantProblem.static_tuple_of(
        dtype=dtype, hidden=hidden, experts=num_experts, top_k=top_k, pad=pad,
        expert_begin=begin, expert_end=end, zero_padding=zero_padding, group_size=group_size,
        column_major_scales=column_major, ue8m0=ue8m0)
    if device >= 0:
        return Checked(result, _route_arguments(
            x, topk_ids, result, dispatch_op._workspace(device, end - begin), num_experts, pad,
            begin, end, zero_padding, group_size, column_major, ue8m0), static, tokens, device)
    # On the CPU the reference fills the capacity's rows of q and the scales, the kernel's
    # layout.
    capacity = dispatch_capacity(tokens, top_k, end - begin, pad)
    rows = DispatchFP8Result(result.q[:capacity], result.scales[:capacity], result.counts,
                             result.offsets, result.row_of, result.error)
    return Checked(result, _route_arguments(x, topk_ids, rows, None, num_experts, pad, begin,
                                            end, zero_padding, group_size, column_major,
                                            ue8m0), static, tokens, device)


def _allocate(x: torch.Tensor, top_k: int, local: int, pad: int, group_size: int,
              column_major: bool) -> DispatchFP8Result:
    tokens, hidden = x.shape
    capacity = dispatch_capacity(tokens, top_k, local, pad)
    counts, offsets, row_of, error = dispatch_op.routing_buffers(x, tokens, top_k, local)
    return DispatchFP8Result(
        torch.empty(capacity, hidden, dtype=FP8_DTYPE, device=x.device),
        empty_scales(capacity, hidden // group_size, column_major, x.device), counts, offsets,
        row_of, error)


def _checked_out(out: DispatchFP8Result, x: torch.Tensor, top_k: int, local: int, pad: int,
                 group_size: int, column_major: bool) -> DispatchFP8Result:
    """`out` where its buffers fit these inputs; else one clear error for the first that does
    not."""
    if not isinstance(out, DispatchFP8Result):
        raise TypeError(f"out must be a DispatchFP8Result (moe_dispatch_fp8_quant_buffers makes "
                        f"one), got {type(out).__name__}")
    dispatch_op.check_buffers(out, "q", FP8_DTYPE, {"scales": (torch.float32, None)}, x, top_k,
                              local, pad, strided=("scales",))
    hidden = x.shape[1]
    rows = tuple(out.q.shape)
    groups = hidden // group_size
    if tuple(out.scales.shape) != (rows[0], groups):
        raise ValueError(f"out.scales must have shape {(rows[0], groups)} (out.q's rows, hidden "
                         f"/ group_size), got {tuple(out.scales.shape)}")
    stride = out.scales.stride()
    if column_major and (stride[0] != 1 or (groups > 1 and stride[1] < rows[0])):
        raise ValueError(f"out.scales must be column-major (strides (1, >= {rows[0]})) with "
                         f"column_major_scales=True, got strides {stride}")
    if not column_major and (stride[1] != 1 or (rows[0] > 1 and stride[0] < groups)):
        raise ValueError(f"out.scales must be row-major (strides (>= {groups}, 1)) with "
                         f"column_major_scales=False, got strides {stride}")
    return out


def _quant_tensors(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int,
                   expert_begin: int | None, expert_end: int | None, validate: bool,
                   zero_padding: bool, group_size: int, column_major_scales: bool,
                   ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                         torch.Tensor, torch.Tensor]:
    expert_range = None if expert_begin is None else (expert_begin, expert_end)
    result = moe_dispatch_fp8_quant(x, topk_ids, num_experts, pad, expert_range, validate,
                                    zero_padding, group_size, column_major_scales, ue8m0)
    # A custom op's outputs may not alias one another: counts, offsets and the error flag are
    # views of one allocation in eager mode, so here they are copies.
    return (result.q, result.scales, result.counts.clone(), result.offsets.clone(),
            result.row_of, result.error.clone())


def _quant_shapes(x, topk_ids, num_experts, pad, expert_begin, expert_end, validate,
                  zero_padding, group_size, column_major_scales, ue8m0):
    """The outputs' shapes, as `_quant_tensors` allocates them."""
    local = num_experts if expert_begin is None else expert_end - expert_begin
    result = _allocate(x, topk_ids.shape[1], local, pad, group_size, column_major_scales)
    return (result.q, result.scales, topk_ids.new_empty((local,)),
            topk_ids.new_empty((local + 1,)), result.row_of, topk_ids.new_empty((1,)))


def _quant_into(x: torch.Tensor, topk_ids: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                counts: torch.Tensor, offsets: torch.Tensor, row_of: torch.Tensor,
                error: torch.Tensor, num_experts: int, pad: int, expert_begin: int | None,
                expert_end: int | None, validate: bool, zero_padding: bool, group_size: int,
                column_major_scales: bool, ue8m0: bool) -> None:
    expert_range = None if expert_begin is None else (expert_begin, expert_end)
    moe_dispatch_fp8_quant(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding,
                           group_size, column_major_scales, ue8m0,
                           DispatchFP8Result(q, scales, counts, offsets, row_of, error))


def _traced(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding, group_size,
            column_major, ue8m0, out) -> DispatchFP8Result:
    """The call as torch.compile records it: the custom op that allocates the outputs, else
    the one that writes `out`."""
    begin, end = (None, None) if expert_range is None else expert_range
    quant = (group_size, column_major, ue8m0)
    if out is None:
        return DispatchFP8Result(*torch.ops.cutetune.moe_dispatch_fp8_quant(
            x, topk_ids, num_experts, pad, begin, end, validate, zero_padding, *quant))
    torch.ops.cutetune.moe_dispatch_fp8_quant_into(
        x, topk_ids, out.q, out.scales, out.counts, out.offsets, out.row_of, out.error,
        num_experts, pad, begin, end, validate, zero_padding, *quant)
    return out


def _calls(t, problem: MoEDispatchFP8QuantProblem):
    buffers = DispatchFP8Result(t["q"], kernel_scales(t["scales"], problem.column_major_scales),
                                t["counts"], t["offsets"], t["row_of"], t["error"])
    return {f"moe_dispatch_fp8_quant{suffix}": lambda out=out: moe_dispatch_fp8_quant(
        t["x"], t["topk_ids"], problem.experts, pad=problem.pad,
        expert_range=(problem.expert_begin, problem.expert_end),
        zero_padding=problem.zero_padding, group_size=problem.group_size,
        column_major_scales=problem.column_major_scales, ue8m0=problem.ue8m0, out=out)
        for suffix, out in (("", None), (" into buffers", buffers))}


def _returned(result: DispatchFP8Result, problem: MoEDispatchFP8QuantProblem) -> dict:
    """A call's outputs, the scales as the kernel's `scales` holds them."""
    return {"q": result.q, "scales": kernel_scales(result.scales, problem.column_major_scales),
            "counts": result.counts, "offsets": result.offsets, "row_of": result.row_of,
            "error": result.error}


# The kernel checks every buffer but q's rows, which it takes as enough (the scales' rows are
# q's, one symbolic extent of the compile): the route holds them to the capacity.
_MOE_DISPATCH_FP8_QUANT = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("x", "topk_ids", "row_of", "q", "scales", "counts", "offsets", "error",
                   "workspace", "num_experts", "pad", "expert_begin", "expert_end",
                   "zero_padding", "group_size", "column_major_scales", "ue8m0"), launched=9,
        tokens=Dim("x", 0),
        fields={"dtype": DType("x"), "hidden": Dim("x", 1), "experts": Value("num_experts"),
                "top_k": Dim("topk_ids", 1), "pad": Value("pad"),
                "expert_begin": Value("expert_begin"), "expert_end": Value("expert_end"),
                "zero_padding": Value("zero_padding"), "group_size": Value("group_size"),
                "column_major_scales": Value("column_major_scales"), "ue8m0": Value("ue8m0")},
        rows_per_token=RowsPerToken("q", lambda p: (
            p.top_k, dispatch_capacity(0, p.top_k, p.local_experts, p.pad))),
        launch_function=dispatch_op._launch_function),
    check=_checked,
    functions=(moe_dispatch_fp8_quant, moe_dispatch_fp8_quant_buffers),
    custom_ops=(
        CustomOp("moe_dispatch_fp8_quant", _quant_tensors, fake=_quant_shapes),
        CustomOp("moe_dispatch_fp8_quant_into", _quant_into,
                 mutates=("q", "scales", "counts", "offsets", "row_of", "error"))),
    calls=_calls,
    prepare=_prepared,
    traced=_traced,
    returned=_returned,
))
