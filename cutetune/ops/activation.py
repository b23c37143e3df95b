"""cutetune.silu_and_mul and cutetune.gelu_and_mul: one op per kernel, declared alike."""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.activation import GELU_FORMS, GELU_KERNEL, SILU_KERNEL
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.registry import KernelDef
from cutetune.ops.checks import check_positive_size, device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register


def _check_inputs(op: str, x: torch.Tensor,
                  out: torch.Tensor | None) -> tuple[str, int, int, int]:
    """Raise one clear error for the first thing wrong with the inputs; else return the dtype
    name, the token count, the intermediate width and x's CUDA device index (-1: the CPU).

    The valid case reads each attribute once (every tensor attribute read costs host time,
    and this runs on every call). Any config of the space may serve the call, so rows,
    row strides and the up half are held to 16 bytes, the widest vector. Devices are checked
    last, so that everything else is testable on a machine without a GPU."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    dtype = x.dtype
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"x has dtype {dtype}: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    shape = tuple(x.shape)
    if len(shape) != 2 or shape[1] % 2:
        raise ValueError(f"x must be (tokens, 2 * intermediate) with an even last dim, got "
                         f"shape {shape}")
    check_positive_size("x's last dim (2 * intermediate)", shape[1])
    name = DTYPE_NAMES[dtype]
    element_bytes = DTYPE_BYTES[name]
    intermediate = shape[1] // 2
    if intermediate * element_bytes % 16:
        raise ValueError(f"the intermediate width {intermediate} must be a multiple of 16 bytes "
                         f"({16 // element_bytes} elements of {dtype}), so that the up half "
                         "starts on a 16-byte boundary")
    _check_rows("x", x, element_bytes)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype is not dtype:
            raise TypeError(f"out has dtype {out.dtype} but x has {dtype}: they must match")
        if tuple(out.shape) != (shape[0], intermediate):
            raise ValueError(f"out must be (tokens, intermediate) = {(shape[0], intermediate)} "
                             f"for x of shape {shape}, got {tuple(out.shape)}")
        _check_rows("out", out, element_bytes)
    return name, shape[0], intermediate, device_index(op, "x", x, (("out", out),))


def _check_rows(name: str, t: torch.Tensor, element_bytes: int) -> None:
    stride = t.stride()
    if stride[1] != 1:
        raise ValueError(f"the rows of {name} must be contiguous (strides (*, 1)), got strides "
                         f"{stride}")
    if stride[0] * element_bytes % 16:
        raise ValueError(f"the row stride of {name} ({stride[0]} elements) must be a multiple "
                         "of 16 bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start 16-byte aligned")


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x of shape (tokens, 2I), in one launch on the current
    stream; computed in fp32, written to `out` (tokens, I) in x's dtype (allocated when None).

    x may be a view with a padded row stride (a multiple of 16 bytes); out must not overlap
    x. The kernel is the winner tuned for this device and token bucket when
    `cutetune.warmup` loaded one, else the heuristic default. On CPU tensors the op computes
    with the kernel's fp32 reference instead (cutetune.ops.cpu). Under torch.compile the call
    is the custom op cutetune::silu_and_mul."""
    return _SILU_AND_MUL((x, out))


def gelu_and_mul(x: torch.Tensor, approximate: str = "none",
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x[:, :I]) * x[:, I:] for x of shape (tokens, 2I); `approximate` is "none" (the
    erf form) or "tanh", as in torch.nn.functional.gelu. Otherwise as `silu_and_mul` (under
    torch.compile: the custom op cutetune::gelu_and_mul)."""
    if approximate not in GELU_FORMS:
        raise ValueError(f"approximate must be one of {GELU_FORMS}, got {approximate!r}")
    return _GELU_AND_MUL((x, out, approximate))


def _allocated(x: torch.Tensor, out: None, *static: str) -> tuple[tuple, torch.Tensor]:
    out = x.new_empty((x.shape[0], x.shape[1] // 2))
    return (x, out, *static), out


def _checked(kernel: KernelDef, fields: tuple[str, ...] = ()):
    """The checks of `kernel`'s op, whose call is (x, out, *the static `fields` beyond dtype
    and intermediate, each passed as the argument of its name)."""

    def checked(x: torch.Tensor, out: torch.Tensor | None, *rest) -> Checked:
        *values, allocated = rest
        dtype, tokens, intermediate, device = _check_inputs(kernel.name, x, out)
        if out is None:
            out = x.new_empty((tokens, intermediate)) if allocated is None else allocated
        if tokens == 0:
            return Checked(out)
        key = kernel.problem_type.static_tuple_of(
            dtype=dtype, intermediate=intermediate, **dict(zip(fields, values, strict=True)))
        return Checked(out, (x, out, *values), key, tokens, device)

    return checked


def _silu_into(x: torch.Tensor, out: torch.Tensor) -> None:
    silu_and_mul(x, out)


def _gelu_into(x: torch.Tensor, out: torch.Tensor, approximate: str) -> None:
    gelu_and_mul(x, approximate, out)


# x is (tokens, 2 * intermediate): its width fixes the intermediate width.
_GATED = {"dtype": DType("x"), "intermediate": Dim("x", 1)}

_SILU_AND_MUL = register(OpDef(
    kernel=SILU_KERNEL,
    fast_call=FastCall(arguments=("x", "out"), launched=2, tokens=Dim("x", 0), fields=_GATED),
    check=_checked(SILU_KERNEL),
    functions=(silu_and_mul,),
    custom_ops=(CustomOp("silu_and_mul", _silu_into, mutates=("out",)),),
    calls=lambda t, problem: {"silu_and_mul": lambda: silu_and_mul(t["x"], out=t["out"])},
    output="out",
    prepare=_allocated,
))

_GELU_AND_MUL = register(OpDef(
    kernel=GELU_KERNEL,
    fast_call=FastCall(arguments=("x", "out", "approximate"), launched=2, tokens=Dim("x", 0),
                       fields={**_GATED, "approximate": Value("approximate")}),
    check=_checked(GELU_KERNEL, ("approximate",)),
    functions=(gelu_and_mul,),
    custom_ops=(CustomOp("gelu_and_mul", _gelu_into, mutates=("out",)),),
    calls=lambda t, problem: {"gelu_and_mul": lambda: gelu_and_mul(
        t["x"], approximate=problem.approximate, out=t["out"])},
    output="out",
    prepare=_allocated,
))
