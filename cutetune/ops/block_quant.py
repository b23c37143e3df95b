"""cutetune.mxfp8_quant and cutetune.nvfp4_quant: one op per kernel, declared alike."""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels import scale_layout as layouts
from cutetune.kernels.block_quant import (
    BLOCK,
    INPUT_DTYPES,
    MXFP8,
    MXFP8_KERNEL,
    NVFP4,
    NVFP4_KERNEL,
    PACKING,
    SCALE_DTYPES,
    VALUE_DTYPES,
)
from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.ops.checks import check_positive_size, device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

# x is loaded up to 256 bits at a time (on sm_100), q stored up to 128.
X_ALIGN = 32
OUT_ALIGN = 16


def _check_inputs(fmt: str, x: torch.Tensor, global_scale: torch.Tensor | None,
                  q: torch.Tensor | None, scales: torch.Tensor | None,
                  layout: str) -> tuple[str, int, int, int]:
    """Raise one clear error for the first thing wrong with the call; else return x's dtype
    name, the token count, the row width and x's CUDA device index (-1: the CPU). Devices are
    checked last, so that everything else is testable without a GPU."""
    op = f"{fmt}_quant"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if DTYPE_NAMES.get(x.dtype) not in INPUT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}: {op} quantises torch.bfloat16 or torch.float16")
    if x.dim() != 2:
        raise ValueError(f"x must be (tokens, hidden), got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    check_positive_size("x's hidden size (x.shape[1])", hidden)
    block = BLOCK[fmt]
    if hidden % block:
        raise ValueError(f"x's hidden size {hidden} must be a multiple of {fmt}'s block of "
                         f"{block} elements")
    if layout not in layouts.SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {layouts.SCALE_LAYOUTS}, got "
                         f"{layout!r}")
    _check_rows("x", x, X_ALIGN)
    if fmt == NVFP4:  # its one required tensor beyond x: None is no scale
        _check_tensor("global_scale", global_scale, torch.float32, (1,))
    if q is not None:
        _check_tensor("q", q, VALUE_DTYPES[fmt], (tokens, hidden // PACKING[fmt]))
        _check_rows("q", q, OUT_ALIGN)
    if scales is not None:
        shape = layouts.scales_shape(layout, tokens, hidden // block)
        _check_tensor("scales", scales, SCALE_DTYPES[fmt], shape)
        if not scales.is_contiguous() or scales.data_ptr() % OUT_ALIGN:
            raise ValueError(f"scales must be contiguous and start {OUT_ALIGN}-byte aligned")
    device = device_index(op, "x", x, (("global_scale", global_scale), ("q", q),
                                       ("scales", scales)))
    return DTYPE_NAMES[x.dtype], tokens, hidden, device


def _check_tensor(name: str, t, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} (a {dtype} "
                        f"tensor of shape {shape})")
    if t.dtype is not dtype:
        raise TypeError(f"{name} has dtype {t.dtype}: it must be {dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _check_rows(name: str, t: torch.Tensor, align: int) -> None:
    stride = t.stride()
    if stride[1] != 1:
        raise ValueError(f"the rows of {name} must be contiguous (strides (*, 1)), got strides "
                         f"{stride}")
    if stride[0] * t.element_size() % align or t.data_ptr() % align:
        raise ValueError(f"{name} must start {align}-byte aligned with a row stride a multiple "
                         f"of {align} bytes")


def mxfp8_quant(x: torch.Tensor, scale_layout: str = "swizzled", q: torch.Tensor | None = None,
                scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 quantisation of x (tokens, hidden) bf16/fp16, hidden a multiple of 32: returns q
    (tokens, hidden) torch.float8_e4m3fn and the E8M0 scales (torch.float8_e8m0fnu), one per
    block of 32, in `scale_layout`: "swizzled" (the 128 x 4 tiles Blackwell's block-scaled
    GEMMs read, (round_up(tokens, 128), round_up(hidden / 32, 4)), padding zero) or
    "row_major" (tokens, hidden / 32). The math, NaN and Inf included:
    cutetune.kernels.block_quant. q and scales are allocated where None. On CPU tensors the
    kernel's reference computes instead. Under torch.compile the call is the custom op
    cutetune::mxfp8_quant, or cutetune::mxfp8_quant_into where q or scales is given (which
    torch 2.13's inductor cannot compile: it lowers no write into a float8_e8m0fnu buffer)."""
    return _MXFP8_QUANT((x, q, scales, scale_layout))


def nvfp4_quant(x: torch.Tensor, global_scale: torch.Tensor, scale_layout: str = "swizzled",
                q: torch.Tensor | None = None, scales: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantisation of x (tokens, hidden) bf16/fp16, hidden a multiple of 16, under
    `global_scale` (one fp32 element: 448 * 6 / the tensor's calibrated amax): returns q
    (tokens, hidden / 2) torch.float4_e2m1fn_x2 (the even element in the low nibble) and the
    e4m3 scales (torch.float8_e4m3fn), one per block of 16, in `scale_layout` as in
    `mxfp8_quant`. Under torch.compile the call is the custom op cutetune::nvfp4_quant
    (cutetune::nvfp4_quant_into where q or scales is given)."""
    return _NVFP4_QUANT((x, global_scale, q, scales, scale_layout))


def _prepare(fmt: str):
    """The route's arguments with q and scales allocated where the call gives none, and the
    op's result."""

    def prepared(x, *rest):
        *global_scale, q, scales, layout = rest
        tokens, hidden = x.shape
        if q is None:
            q = torch.empty((tokens, hidden // PACKING[fmt]), dtype=VALUE_DTYPES[fmt],
                            device=x.device)
        if scales is None:
            scales = torch.empty(layouts.scales_shape(layout, tokens, hidden // BLOCK[fmt]),
                                 dtype=SCALE_DTYPES[fmt], device=x.device)
        return (x, *global_scale, q, scales, layout), (q, scales)

    return prepared


def _checked(kernel, fmt: str):
    prepare = _prepare(fmt)

    def checked(x, *rest) -> Checked:
        *call, allocated = rest
        *global_scale, q, scales, layout = call
        dtype, tokens, hidden, device = _check_inputs(
            fmt, x, global_scale[0] if global_scale else None, q, scales, layout)
        arguments, result = prepare(x, *call)
        if allocated is not None:
            arguments = (x, *global_scale, *allocated, layout)
            result = allocated
        if tokens == 0:
            return Checked(result)
        key = kernel.problem_type.static_tuple_of(dtype=dtype, hidden=hidden,
                                                  scale_layout=layout)
        return Checked(result, arguments, key, tokens, device)

    return checked


def _traced(fmt: str):
    """The call under torch.compile: the custom op that returns new q and scales where the call
    gives neither, else the one that writes them (the missing one allocated)."""
    prepare = _prepare(fmt)

    def traced(x, *rest):
        *global_scale, q, scales, layout = rest
        if q is None and scales is None:
            return getattr(torch.ops.cutetune, f"{fmt}_quant")(x, *global_scale, layout)
        arguments, result = prepare(x, *rest)
        getattr(torch.ops.cutetune, f"{fmt}_quant_into")(*arguments)
        return result

    return traced


def _mxfp8_tensors(x: torch.Tensor, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    return mxfp8_quant(x, scale_layout)


def _nvfp4_tensors(x: torch.Tensor, global_scale: torch.Tensor,
                   scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    return nvfp4_quant(x, global_scale, scale_layout)


def _shapes(fmt: str):
    """The allocating custom op's outputs as `_prepare` makes them (its fake)."""
    prepare = _prepare(fmt)

    def shapes(x, *rest):
        *global_scale, layout = rest
        return prepare(x, *global_scale, None, None, layout)[1]

    return shapes


def _mxfp8_into(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                scale_layout: str) -> None:
    mxfp8_quant(x, scale_layout, q, scales)


def _nvfp4_into(x: torch.Tensor, global_scale: torch.Tensor, q: torch.Tensor,
                scales: torch.Tensor, scale_layout: str) -> None:
    nvfp4_quant(x, global_scale, scale_layout, q, scales)


_FIELDS = {"dtype": DType("x"), "hidden": Dim("x", 1), "scale_layout": Value("scale_layout")}

_MXFP8_QUANT = register(OpDef(
    kernel=MXFP8_KERNEL,
    fast_call=FastCall(arguments=("x", "q", "scales", "scale_layout"), launched=3,
                       tokens=Dim("x", 0), fields=_FIELDS),
    check=_checked(MXFP8_KERNEL, MXFP8),
    functions=(mxfp8_quant,),
    custom_ops=(CustomOp("mxfp8_quant", _mxfp8_tensors, fake=_shapes(MXFP8)),
                CustomOp("mxfp8_quant_into", _mxfp8_into, mutates=("q", "scales"))),
    calls=lambda t, problem: {"mxfp8_quant": lambda: mxfp8_quant(
        t["x"], problem.scale_layout, t["q"], t["scales"])},
    prepare=_prepare(MXFP8),
    traced=_traced(MXFP8),
))

_NVFP4_QUANT = register(OpDef(
    kernel=NVFP4_KERNEL,
    fast_call=FastCall(arguments=("x", "global_scale", "q", "scales", "scale_layout"),
                       launched=4, tokens=Dim("x", 0), fields=_FIELDS),
    check=_checked(NVFP4_KERNEL, NVFP4),
    functions=(nvfp4_quant,),
    custom_ops=(CustomOp("nvfp4_quant", _nvfp4_tensors, fake=_shapes(NVFP4)),
                CustomOp("nvfp4_quant_into", _nvfp4_into, mutates=("q", "scales"))),
    calls=lambda t, problem: {"nvfp4_quant": lambda: nvfp4_quant(
        t["x"], t["global_scale"], problem.scale_layout, t["q"], t["scales"])},
    prepare=_prepare(NVFP4),
    traced=_traced(NVFP4),
))
