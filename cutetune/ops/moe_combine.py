"""cutetune.moe_combine: the weighted sum of the experts' rows back into each token's."""

from __future__ import annotations

import math

import torch

from cutetune.fast_call import Constant, Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.moe_combine import KERNEL, MAX_TOP_K
from cutetune.kernels.moe_common import DEFAULT_PAD, MOE_DTYPES, MoEProblem
from cutetune.ops.checks import check_int, device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

_VECTOR_BYTES = 16


def _check_inputs(expert_out: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor,
                  out: torch.Tensor | None) -> int:
    """Raise one clear error for the first thing wrong with the inputs; return expert_out's
    CUDA device index (-1: the CPU).

    The valid case reads each attribute once (every tensor attribute read costs host time,
    and this runs on every call). Any config of the space may serve the call, so rows
    and row strides are held to the widest vector that divides the hidden size. Devices are
    checked last, so that everything else is testable on a machine without a GPU."""
    named = (("expert_out", expert_out), ("row_of", row_of), ("topk_weights", topk_weights),
             ("out", out))
    for name, t in named:
        if not isinstance(t, torch.Tensor) and (t is not None or name != "out"):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = expert_out.dtype
    if DTYPE_NAMES.get(dtype) not in MOE_DTYPES:
        raise TypeError(f"expert_out has dtype {dtype}: use torch.bfloat16 or torch.float16")
    if row_of.dtype is not torch.int32:
        raise TypeError(f"row_of has dtype {row_of.dtype}: it must be torch.int32")
    if topk_weights.dtype is not torch.float32:
        raise TypeError(f"topk_weights has dtype {topk_weights.dtype}: it must be "
                        "torch.float32")
    e_shape, r_shape = tuple(expert_out.shape), tuple(row_of.shape)
    if len(e_shape) != 2:
        raise ValueError(f"expert_out must be (capacity, hidden), got shape {e_shape}")
    if len(r_shape) != 2:
        raise ValueError(f"row_of must be (tokens, top_k), got shape {r_shape}")
    if tuple(topk_weights.shape) != r_shape:
        raise ValueError(f"topk_weights must have row_of's shape {r_shape}, got "
                         f"{tuple(topk_weights.shape)}")
    tokens, top_k = r_shape
    hidden = e_shape[1]
    if not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"top_k (row_of's second dim) is {top_k}: moe_combine supports 1 to "
                         f"{MAX_TOP_K}")
    if hidden < 1 or hidden % 2:
        raise ValueError(f"hidden size {hidden} must be positive and even (the narrowest "
                         f"vector is 32 bits, 2 elements of {dtype})")
    if not (row_of.is_contiguous() and topk_weights.is_contiguous()):
        raise ValueError("row_of and topk_weights must be contiguous")
    if out is not None:
        if out.dtype is not dtype:
            raise TypeError(f"out has dtype {out.dtype} but expert_out has {dtype}: they must "
                            "match")
        if tuple(out.shape) != (tokens, hidden):
            raise ValueError(f"out must be (tokens, hidden) = {(tokens, hidden)}, got "
                             f"{tuple(out.shape)}")
    e_stride = expert_out.stride()
    o_stride = e_stride if out is None else out.stride()
    if e_stride[1] != 1 or o_stride[1] != 1 or (tokens > 1 and o_stride[0] < hidden):
        raise ValueError(f"expert_out and out must have contiguous rows, out's not overlapping "
                         f"(strides (>= {hidden}, 1)), got expert_out {e_stride}"
                         + ("" if out is None else f", out {o_stride}"))
    # Every valid config's vector divides this (the widest access that divides the hidden
    # size, at most 16 bytes): row starts and strides aligned to it keep every access whole.
    align = math.gcd(hidden, _VECTOR_BYTES // DTYPE_BYTES[DTYPE_NAMES[dtype]])
    if ((e_stride[0] | o_stride[0]) % align or (expert_out.data_ptr() | (
            0 if out is None else out.data_ptr())) % (align * expert_out.element_size())):
        raise ValueError(f"expert_out and out must start aligned to {align} elements and their "
                         f"row strides must be multiples of {align} elements (the widest vector "
                         f"that divides hidden size {hidden}), got strides expert_out "
                         f"{e_stride}" + ("" if out is None else f", out {o_stride}"))
    return device_index("moe_combine", "expert_out", expert_out, named[1:])


def _check_given(experts: object, pad: object, expert_begin: object,
                 expert_end: object) -> None:
    """The ints moe_dispatch was called with; the problem checks how they relate."""
    for name, value in (("experts", experts), ("expert_end", expert_end)):
        if value is not None:  # None: its default
            check_int(name, value)
    check_int("pad", pad)
    check_int("expert_begin", expert_begin, minimum=0)


def moe_combine(expert_out: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor,
                out: torch.Tensor | None = None, *, experts: int | None = None,
                pad: int = DEFAULT_PAD, expert_begin: int = 0,
                expert_end: int | None = None) -> torch.Tensor:
    """out[t] = sum_k topk_weights[t, k] * expert_out[row_of[t, k]] in one launch on the
    current stream, accumulated in fp32 and written to `out` (tokens, hidden) in expert_out's
    dtype (allocated when None).

    expert_out (capacity, hidden) bf16/fp16 holds the experts' outputs in moe_dispatch's
    layout (rows may be padded, a multiple of the widest vector); row_of (tokens, top_k) int32
    and topk_weights (tokens, top_k) fp32 are contiguous. Pairs whose row is -1, or outside
    [0, capacity), add nothing and are never read. `experts`, `pad` and the local range are
    what moe_dispatch was called with; combine's math does not depend on them, but the kernel
    tuned for the model is looked up by them (the defaults stand for an untuned problem).
    The kernel is the winner tuned for this device and token bucket when `cutetune.warmup`
    loaded one, else the heuristic default. On CPU tensors the op computes with the kernel's
    fp32 reference instead (cutetune.ops.cpu). Under torch.compile the call is the custom op
    cutetune::moe_combine."""
    return _MOE_COMBINE((expert_out, row_of, topk_weights, out, experts, pad, expert_begin,
                         expert_end))


def _allocated(expert_out: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor,
               out: None, *given: int | None) -> tuple[tuple, torch.Tensor]:
    out = expert_out.new_empty((row_of.shape[0], expert_out.shape[1]))
    return (expert_out, row_of, topk_weights, out, *given), out


def _checked(expert_out: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor,
             out: torch.Tensor | None, experts: int | None, pad: int, expert_begin: int,
             expert_end: int | None, allocated: torch.Tensor | None) -> Checked:
    given = (experts, pad, expert_begin, expert_end)
    device = _check_inputs(expert_out, row_of, topk_weights, out)
    _check_given(*given)
    tokens, top_k = row_of.shape
    capacity, hidden = expert_out.shape
    if out is None:
        out = expert_out.new_empty((tokens, hidden)) if allocated is None else allocated
    if tokens == 0:
        return Checked(out)
    if capacity == 0:
        # No expert rows: every pair is skipped.
        return Checked(out.zero_())
    experts = top_k if experts is None else experts
    expert_end = experts if expert_end is None else expert_end
    # The layout's zero_padding is dispatch's concern: combine never reads padding rows.
    static = MoEProblem.static_tuple_of(
        dtype=DTYPE_NAMES[expert_out.dtype], hidden=hidden, experts=experts, top_k=top_k,
        pad=pad, expert_begin=expert_begin, expert_end=expert_end, zero_padding=False)
    return Checked(out, (expert_out, row_of, topk_weights, out, *given), static, tokens, device)


def _combine_into(expert_out: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor,
                  out: torch.Tensor, experts: int | None, pad: int, expert_begin: int,
                  expert_end: int | None) -> None:
    moe_combine(expert_out, row_of, topk_weights, out, experts=experts, pad=pad,
                expert_begin=expert_begin, expert_end=expert_end)


# The kernel does not check that out's rows do not overlap, nor that there are expert rows
# (none is the checked path's case): the route does. zero_padding: see the checked path.
_MOE_COMBINE = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("expert_out", "row_of", "topk_weights", "out", "experts", "pad",
                   "expert_begin", "expert_end"), launched=4,
        tokens=Dim("row_of", 0),
        fields={"dtype": DType("expert_out"), "hidden": Dim("expert_out", 1),
                "experts": Value("experts"), "top_k": Dim("row_of", 1), "pad": Value("pad"),
                "expert_begin": Value("expert_begin"), "expert_end": Value("expert_end"),
                "zero_padding": Constant(False)},
        disjoint_rows=("out",), nonempty=(Dim("expert_out", 0),)),
    check=_checked,
    functions=(moe_combine,),
    custom_ops=(CustomOp("moe_combine", _combine_into, mutates=("out",)),),
    calls=lambda t, problem: {"moe_combine": lambda: moe_combine(
        t["expert_out"], t["row_of"], t["topk_weights"], t["out"], experts=problem.experts,
        pad=problem.pad, expert_begin=problem.expert_begin, expert_end=problem.expert_end)},
    output="out",
    prepare=_allocated,
))
