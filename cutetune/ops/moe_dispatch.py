"""cutetune.moe_dispatch: the token shuffle of a local MoE layer."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch.compiler import is_compiling

from cutetune.fast_call import Dim, DType, FastCall, RowsPerToken, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.moe_common import MOE_DTYPES, MoEProblem, dispatch_capacity
from cutetune.kernels.moe_dispatch import KERNEL
from cutetune.kernels.moe_dispatch.common import MAX_LOCAL_EXPERTS, workspace_words
from cutetune.kernels.moe_dispatch.launcher import CompiledDispatch, CooperativeGridError
from cutetune.ops.checks import (
    check_bool,
    check_int,
    check_positive_size,
    device_index,
    is_int,
)
from cutetune.ops.registry import Checked, CustomOp, OpDef, register


@dataclass(frozen=True)
class DispatchResult:
    """dispatched (capacity, hidden): each local expert's tokens in its padded segment;
    counts (L,) and offsets (L + 1,) int32; row_of (tokens, top_k) int32, -1 where a pair's
    expert is not local (the combine step reads only row_of); error (1,) int32, nonzero where
    an expert id was outside [0, num_experts)."""

    dispatched: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    row_of: torch.Tensor
    error: torch.Tensor


def moe_dispatch_buffers(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                         pad: int = 16,
                         expert_range: tuple[int, int] | None = None) -> DispatchResult:
    """The output buffers of `moe_dispatch` for inputs of x's and topk_ids' sizes, dtype and
    device: allocate them once (for a CUDA graph's batch, say) and pass them as its `out`, so
    that a call allocates nothing."""
    _, begin, end, _ = _check_inputs(x, topk_ids, num_experts, pad, expert_range)
    tokens, hidden = x.shape
    return _allocate(x, tokens, hidden, topk_ids.shape[1], end - begin, pad)


# One workspace per (device, stream, local experts): concurrent calls on different streams
# must not share the barrier word or the counters.
_WORKSPACES: dict[tuple[int, int, int], torch.Tensor] = {}


def _workspace(device: int, local_experts: int) -> torch.Tensor:
    # The raw stream handle, without building a torch.cuda.Stream (which costs the host
    # several times more on every call).
    stream = torch._C._cuda_getCurrentRawStream(device)
    key = (device, stream, local_experts)
    workspace = _WORKSPACES.get(key)
    if workspace is None:
        workspace = torch.zeros(workspace_words(local_experts), dtype=torch.int32,
                                device=torch.device("cuda", device))
        _WORKSPACES[key] = workspace
    return workspace


def _check_inputs(x, topk_ids, num_experts, pad, expert_range) -> tuple[str, int, int, int]:
    """Raise one clear error for the first thing wrong; else return the dtype name, the
    local expert range and x's CUDA device index (-1: the CPU). Devices are checked last."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if x.dtype not in DTYPE_NAMES or DTYPE_NAMES[x.dtype] not in MOE_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}: use torch.bfloat16 or torch.float16")
    if topk_ids.dtype is not torch.int32:
        raise TypeError(f"topk_ids has dtype {topk_ids.dtype}: use torch.int32")
    x_shape, ids_shape = tuple(x.shape), tuple(topk_ids.shape)
    if len(x_shape) != 2:
        raise ValueError(f"x must be (tokens, hidden), got shape {x_shape}")
    if len(ids_shape) != 2 or ids_shape[0] != x_shape[0]:
        raise ValueError(f"topk_ids must be (tokens, top_k) with x's {x_shape[0]} tokens, got "
                         f"shape {ids_shape}")
    check_int("num_experts", num_experts)
    check_int("pad", pad)
    top_k = ids_shape[1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} (topk_ids.shape[1]) must be between 1 and "
                         f"num_experts {num_experts}")
    begin, end = 0, num_experts
    if expert_range is not None:
        pair = tuple(expert_range) if isinstance(expert_range, (tuple, list)) else ()
        if len(pair) != 2 or not all(is_int(v) for v in pair):
            raise ValueError(f"expert_range must be a (begin, end) pair of ints, got "
                             f"{expert_range!r}")
        begin, end = pair
    if not 0 <= begin < end <= num_experts:
        raise ValueError(f"expert_range [{begin}, {end}) must be a non-empty range within "
                         f"[0, {num_experts})")
    if end - begin > MAX_LOCAL_EXPERTS:
        raise ValueError(f"{end - begin} local experts: moe_dispatch supports at most "
                         f"{MAX_LOCAL_EXPERTS}")
    check_positive_size("hidden (x.shape[1])", x_shape[1])
    name = DTYPE_NAMES[x.dtype]
    if x_shape[1] * DTYPE_BYTES[name] % 4:
        raise ValueError(f"hidden {x_shape[1]} must be a multiple of 4 bytes (2 elements of "
                         f"{x.dtype}), the narrowest vector the copy uses")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()}")
    if not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be contiguous, got strides {topk_ids.stride()}")
    if x.data_ptr() % 16:
        raise ValueError("x must start 16-byte aligned")
    return name, begin, end, device_index("moe_dispatch", "x", x, (("topk_ids", topk_ids),))


def moe_dispatch(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int = 16,
                 expert_range: tuple[int, int] | None = None, validate: bool = False,
                 zero_padding: bool = False, out: DispatchResult | None = None
                 ) -> DispatchResult:
    """Route the (token, k) pairs of `topk_ids` (tokens, top_k) int32 to the local experts
    `expert_range` = [begin, end) of `num_experts` (all of them when None) and copy the rows
    of x (tokens, hidden) bf16/fp16 into each expert's segment, padded to a multiple of `pad`,
    on the current stream (moe_common describes the layout). The padding rows are left
    unwritten unless zero_padding=True (then zeros): a grouped GEMM computes each row on its
    own and combine never reads them, and filling them can cost more than the tokens.

    Pairs of other experts get row -1. An expert id outside [0, num_experts) is skipped (row
    -1) and raises a flag on the device; with validate=True the call synchronises and raises
    ValueError if it was raised (off by default: it stalls the host). The kernel is the winner
    tuned for this device and token bucket when `cutetune.warmup` loaded one, else the
    heuristic default. On CPU tensors the op computes with the kernel's torch reference
    instead (cutetune.ops.cpu; it zeros the padding rows).

    The result's tensors are allocated on each call unless `out` gives them
    (`moe_dispatch_buffers` allocates them for inputs of these sizes; `out.dispatched` may have
    more rows than the capacity needs): allocation costs the host several microseconds a
    tensor, more than the rest of the call.

    Scratch (the grid-barrier word, counters) is kept per device and stream; before capturing
    a CUDA graph, call the op once on the capture stream (the usual warm-up), so that its
    workspace is not allocated inside the capture. Under torch.compile the call is the custom
    op cutetune::moe_dispatch (cutetune::moe_dispatch_into with `out`)."""
    return _validated(_MOE_DISPATCH((x, topk_ids, num_experts, pad, expert_range, validate,
                                     zero_padding, out)), validate, num_experts)


def _prepared(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int,
              expert_range: tuple[int, int] | None, validate: bool, zero_padding: bool,
              out: DispatchResult | None) -> tuple[tuple | None, DispatchResult | None]:
    """The route's arguments, the outputs allocated where out is None; none on the CPU (the
    workspace is a CUDA tensor)."""
    device = x.get_device()
    if device < 0:
        return None, None
    begin, end = (0, num_experts) if expert_range is None else expert_range
    if out is None:
        out = _allocate(x, x.shape[0], x.shape[1], topk_ids.shape[1], end - begin, pad)
    return (x, topk_ids, out.row_of, out.dispatched, out.counts, out.offsets, out.error,
            _workspace(device, end - begin), num_experts, pad, begin, end, zero_padding), out


def _launch_function(compiled: CompiledDispatch, device: int):
    """What the fast path calls for `compiled` on `device`: its function, the cooperative grid
    checked there once, as its launch path does (None where the grid does not fit: the checked
    path raises why). Its other check, split_block_ranks' token bound, holds at every token
    count of the bucket it serves."""
    try:
        compiled.check_device(device)
    except CooperativeGridError:
        return None
    return compiled.fn


def _checked(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int,
             expert_range: tuple[int, int] | None, validate: bool, zero_padding: bool,
             out: DispatchResult | None, allocated: DispatchResult | None) -> Checked:
    check_bool("zero_padding", zero_padding)
    check_bool("validate", validate)
    dtype, begin, end, device = _check_inputs(x, topk_ids, num_experts, pad, expert_range)
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    if out is not None:
        result = _checked_out(out, x, top_k, end - begin, pad)
    elif allocated is not None:
        result = allocated
    else:
        result = _allocate(x, tokens, hidden, top_k, end - begin, pad)
    if tokens == 0:
        result.counts.zero_()
        result.offsets.zero_()
        result.error.zero_()
        return Checked(result)
    static = MoEProblem.static_tuple_of(
        dtype=dtype, hidden=hidden, experts=num_experts, top_k=top_k, pad=pad,
        expert_begin=begin, expert_end=end, zero_padding=zero_padding)
    # On the CPU the reference fills the capacity's rows of dispatched, the kernel's layout.
    dispatched = (result.dispatched if device >= 0
                  else result.dispatched[:dispatch_capacity(tokens, top_k, end - begin, pad)])
    workspace = _workspace(device, end - begin) if device >= 0 else None
    return Checked(result, (x, topk_ids, result.row_of, dispatched, result.counts,
                            result.offsets, result.error, workspace, num_experts, pad, begin, end,
                            zero_padding), static, tokens, device)


def _allocate(x: torch.Tensor, tokens: int, hidden: int, top_k: int, local: int,
              pad: int) -> DispatchResult:
    counts, offsets, row_of, error = routing_buffers(x, tokens, top_k, local)
    return DispatchResult(x.new_empty((dispatch_capacity(tokens, top_k, local, pad), hidden)),
                          counts, offsets, row_of, error)


def routing_buffers(x: torch.Tensor, tokens: int, top_k: int, local: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dispatch's counts, offsets, row_of and error flag on x's device: counts, offsets and
    the flag in one allocation, cut by one call (three slices cost the host nearly twice as
    much)."""
    small = torch.empty(2 * local + 2, dtype=torch.int32, device=x.device)
    counts, offsets, error = small.split_with_sizes((local, local + 1, 1))
    return counts, offsets, torch.empty(tokens, top_k, dtype=torch.int32, device=x.device), error


def _checked_out(out: DispatchResult, x: torch.Tensor, top_k: int, local: int,
                 pad: int) -> DispatchResult:
    """`out` where its buffers fit these inputs; else one clear error for the first that does
    not."""
    if not isinstance(out, DispatchResult):
        raise TypeError(f"out must be a DispatchResult (moe_dispatch_buffers makes one), got "
                        f"{type(out).__name__}")
    check_buffers(out, "dispatched", x.dtype, {}, x, top_k, local, pad)
    return out


def check_buffers(out, rows_name: str, rows_dtype: torch.dtype,
                  others: dict[str, tuple[torch.dtype, tuple[int, ...] | None]],
                  x: torch.Tensor, top_k: int, local: int, pad: int,
                  strided: tuple[str, ...] = ()) -> None:
    """A dispatch's output buffers in `out` against these inputs: the rows buffer `rows_name`
    (rows_dtype, at least the capacity's rows of x's width, 16-byte aligned), the routing
    buffers (counts, offsets, row_of, error) and `others` (name: (dtype, shape or None)),
    each a tensor on x's device, contiguous unless named in `strided`. One clear error for
    the first that does not fit."""
    tokens, hidden = x.shape
    capacity = dispatch_capacity(tokens, top_k, local, pad)
    wanted = {rows_name: (rows_dtype, None), **others, "counts": (torch.int32, (local,)),
              "offsets": (torch.int32, (local + 1,)), "row_of": (torch.int32, (tokens, top_k)),
              "error": (torch.int32, (1,))}
    for name, (dtype, shape) in wanted.items():
        t = getattr(out, name)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"out.{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype is not dtype:
            raise TypeError(f"out.{name} has dtype {t.dtype}: it must be {dtype}")
        if t.device != x.device:
            raise ValueError(f"out.{name} is on {t.device} but x is on {x.device}")
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"out.{name} must have shape {shape} for these inputs, got "
                             f"{tuple(t.shape)}")
        if name not in strided and not t.is_contiguous():
            raise ValueError(f"out.{name} must be contiguous, got strides {t.stride()}")
    rows = tuple(getattr(out, rows_name).shape)
    if len(rows) != 2 or rows[1] != hidden or rows[0] < capacity:
        raise ValueError(f"out.{rows_name} must be (rows, {hidden}) with rows >= {capacity} (the "
                         f"capacity of {tokens} tokens x top_k {top_k} plus {local} experts' "
                         f"padding), got shape {rows}")
    if getattr(out, rows_name).data_ptr() % 16:
        raise ValueError(f"out.{rows_name} must start 16-byte aligned")


def _validated(result: DispatchResult, validate: bool, num_experts: int) -> DispatchResult:
    """`result`, where validate asks, checked for the flag the kernel raises (under
    torch.compile the custom op's eager call checks it)."""
    if validate and not is_compiling() and int(result.error.item()):
        raise ValueError(f"topk_ids holds expert ids outside [0, {num_experts}): those pairs "
                         "were skipped (row -1)")
    return result


def _dispatch_tensors(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int,
                      expert_begin: int | None, expert_end: int | None, validate: bool,
                      zero_padding: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor, torch.Tensor]:
    expert_range = None if expert_begin is None else (expert_begin, expert_end)
    result = moe_dispatch(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding)
    # A custom op's outputs may not alias one another: counts, offsets and the error flag are
    # views of one allocation in eager mode, so here they are copies.
    return (result.dispatched, result.counts.clone(), result.offsets.clone(), result.row_of,
            result.error.clone())


def _dispatch_shapes(x, topk_ids, num_experts, pad, expert_begin, expert_end, validate,
                     zero_padding):
    """The outputs' shapes, as `_moe_dispatch` allocates them."""
    local = num_experts if expert_begin is None else expert_end - expert_begin
    tokens, top_k = topk_ids.shape
    capacity = dispatch_capacity(tokens, top_k, local, pad)
    return (x.new_empty((capacity, x.shape[1])),
            topk_ids.new_empty((local,)), topk_ids.new_empty((local + 1,)),
            topk_ids.new_empty((tokens, top_k)), topk_ids.new_empty((1,)))


def _dispatch_into(x: torch.Tensor, topk_ids: torch.Tensor, dispatched: torch.Tensor,
                   counts: torch.Tensor, offsets: torch.Tensor, row_of: torch.Tensor,
                   error: torch.Tensor, num_experts: int, pad: int, expert_begin: int | None,
                   expert_end: int | None, validate: bool, zero_padding: bool) -> None:
    expert_range = None if expert_begin is None else (expert_begin, expert_end)
    moe_dispatch(x, topk_ids, num_experts, pad, expert_range, validate, zero_padding,
                 DispatchResult(dispatched, counts, offsets, row_of, error))


def _traced(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, pad: int,
            expert_range: tuple[int, int] | None, validate: bool, zero_padding: bool,
            out: DispatchResult | None) -> DispatchResult:
    """The call as torch.compile records it: the custom op that allocates the outputs, else
    the one that writes `out`."""
    begin, end = (None, None) if expert_range is None else expert_range
    if out is None:
        return DispatchResult(*torch.ops.cutetune.moe_dispatch(
            x, topk_ids, num_experts, pad, begin, end, validate, zero_padding))
    torch.ops.cutetune.moe_dispatch_into(
        x, topk_ids, out.dispatched, out.counts, out.offsets, out.row_of, out.error,
        num_experts, pad, begin, end, validate, zero_padding)
    return out


def _calls(t, problem: MoEProblem):
    buffers = DispatchResult(t["dispatched"], t["counts"], t["offsets"], t["row_of"],
                             t["error"])
    return {f"moe_dispatch{suffix}": lambda out=out: moe_dispatch(
        t["x"], t["topk_ids"], problem.experts, pad=problem.pad,
        expert_range=(problem.expert_begin, problem.expert_end),
        zero_padding=problem.zero_padding, out=out)
        for suffix, out in (("", None), (" into buffers", buffers))}


# The kernel checks every buffer but the dispatched rows, which it takes as enough: the route
# holds them to the capacity (moe_common.dispatch_capacity, linear in the tokens).
_MOE_DISPATCH = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("x", "topk_ids", "row_of", "dispatched", "counts", "offsets", "error",
                   "workspace", "num_experts", "pad", "expert_begin", "expert_end",
                   "zero_padding"), launched=8,
        tokens=Dim("x", 0),
        fields={"dtype": DType("x"), "hidden": Dim("x", 1), "experts": Value("num_experts"),
                "top_k": Dim("topk_ids", 1), "pad": Value("pad"),
                "expert_begin": Value("expert_begin"), "expert_end": Value("expert_end"),
                "zero_padding": Value("zero_padding")},
        rows_per_token=RowsPerToken("dispatched", lambda p: (
            p.top_k, dispatch_capacity(0, p.top_k, p.local_experts, p.pad))),
        launch_function=_launch_function),
    check=_checked,
    functions=(moe_dispatch, moe_dispatch_buffers),
    custom_ops=(
        CustomOp("moe_dispatch", _dispatch_tensors, fake=_dispatch_shapes),
        CustomOp("moe_dispatch_into", _dispatch_into,
                 mutates=("dispatched", "counts", "offsets", "row_of", "error"))),
    calls=_calls,
    prepare=_prepared,
    traced=_traced,
    returned=lambda result, problem: {f.name: getattr(result, f.name) for f in fields(result)},
))
