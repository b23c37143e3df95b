"""cutetune.silu_and_mul and cutetune.gelu_and_mul, served by the dispatcher."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from cutetune.dispatch import current_dispatcher
from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.fast_path import Route, route
from cutetune.kernels.activation import (
    GELU_FORMS,
    GELU_KERNEL,
    SILU_KERNEL,
)
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.registry import KernelDef
from cutetune.ops.cpu import write_reference

# x is (tokens, 2 * intermediate): its width fixes the intermediate width.
_GATED = {"dtype": DType("x"), "intermediate": Dim("x", 1)}
_SILU_ROUTE = route(SILU_KERNEL, FastCall(
    arguments=("x", "out"), launched=2, tokens=Dim("x", 0), fields=_GATED))
_GELU_ROUTE = route(GELU_KERNEL, FastCall(
    arguments=("x", "out", "approximate"), launched=2, tokens=Dim("x", 0),
    fields={**_GATED, "approximate": Value("approximate")}))


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
    device = x.get_device()
    if device < 0 and x.device.type != "cpu":
        raise ValueError(f"x is on {x.device}: {op} runs on a CUDA device or the CPU")
    if out is not None and out.get_device() != device:
        raise ValueError(f"out is on {out.device} but x is on {x.device}")
    return name, shape[0], intermediate, device


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


def _act_and_mul(kernel: KernelDef, route: Route, x: torch.Tensor,
                 out: torch.Tensor | None, **static: str) -> torch.Tensor:
    """The op's call: its fast path (cutetune.fast_path), which also takes the `static`
    fields beyond dtype and intermediate; else the checked path."""
    result = out  # allocated here where None, it serves the checked path too
    try:
        if result is None:
            result = _new_out(x)
        if route.call(x, result, *static.values()):
            return result
    except (AttributeError, IndexError, TypeError, ValueError):  # the checks name the fault
        pass
    dtype, tokens, intermediate, device = _check_inputs(kernel.name, x, out)
    if out is None:
        out = x.new_empty((tokens, intermediate)) if result is None else result
    if tokens == 0:
        return out
    key = kernel.problem_type.static_tuple_of(dtype=dtype, intermediate=intermediate, **static)
    if device < 0:
        write_reference(kernel, key, tokens, {"x": x}, {"out": out})
        return out
    current_dispatcher().lookup(kernel, key, tokens, route, (x, out, *static.values()))(x, out)
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x of shape (tokens, 2I), in one launch on the current
    stream; computed in fp32, written to `out` (tokens, I) in x's dtype (allocated when None).

    x may be a view with a padded row stride (a multiple of 16 bytes); out must not overlap
    x. The kernel is the winner tuned for this device and token bucket when
    `cutetune.warmup` loaded one, else the heuristic default. On CPU tensors the op computes
    with the kernel's fp32 reference instead (cutetune.ops.cpu). Under torch.compile the call
    is the custom op cutetune::silu_and_mul."""
    if is_compiling():
        out = _new_out(x) if out is None else out
        _SILU_OP(x, out)
        return out
    return _act_and_mul(SILU_KERNEL, _SILU_ROUTE, x, out)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none",
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x[:, :I]) * x[:, I:] for x of shape (tokens, 2I); `approximate` is "none" (the
    erf form) or "tanh", as in torch.nn.functional.gelu. Otherwise as `silu_and_mul` (under
    torch.compile: the custom op cutetune::gelu_and_mul)."""
    if approximate not in GELU_FORMS:
        raise ValueError(f"approximate must be one of {GELU_FORMS}, got {approximate!r}")
    if is_compiling():
        out = _new_out(x) if out is None else out
        _GELU_OP(x, out, approximate)
        return out
    return _act_and_mul(GELU_KERNEL, _GELU_ROUTE, x, out, approximate=approximate)


def _new_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def _silu_into(x: torch.Tensor, out: torch.Tensor) -> None:
    _act_and_mul(SILU_KERNEL, _SILU_ROUTE, x, out)


def _gelu_into(x: torch.Tensor, out: torch.Tensor, approximate: str) -> None:
    _act_and_mul(GELU_KERNEL, _GELU_ROUTE, x, out, approximate=approximate)


_SILU_OP = torch.library.custom_op("cutetune::silu_and_mul", _silu_into, mutates_args=("out",))
_SILU_OP.register_fake(lambda x, out: None)
_GELU_OP = torch.library.custom_op("cutetune::gelu_and_mul", _gelu_into, mutates_args=("out",))
_GELU_OP.register_fake(lambda x, out, approximate: None)
