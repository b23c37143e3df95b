"""cutetune.rmsnorm and cutetune.fused_add_rmsnorm: one op, the kernel's plain and fused
forms."""

from __future__ import annotations

import math

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.rmsnorm import KERNEL, MAX_HIDDEN, MIN_HIDDEN, MIN_VECTOR_BITS, RMSNormProblem
from cutetune.ops.checks import check_norm_scalars, device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

_VECTOR_BYTES = 16


def _row_strides(named) -> str:
    return ", ".join(f"{n} {t.stride()}" for n, t in named if t is not None and n != "weight")


def _check_inputs(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                  out: torch.Tensor | None, out_dtype: torch.dtype | None
                  ) -> tuple[torch.dtype, int]:
    """Raise one clear error for the first thing wrong with the inputs; return the output
    dtype and x's CUDA device index (-1: the CPU). `residual` and `out` may be None (plain
    form; out allocated by the caller).

    The valid case reads each attribute once (every tensor attribute read costs host time,
    and this runs on every call); naming the offending tensor is left to the error path. The
    device is checked last, so that everything else is testable on the CPU."""
    named = (("x", x), ("residual", residual), ("weight", weight), ("out", out))
    for name, t in named:
        if not isinstance(t, torch.Tensor) and (t is not None or name in ("x", "weight")):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = x.dtype
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"x has dtype {dtype}: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if not (weight.dtype is dtype and (residual is None or residual.dtype is dtype)):
        name = "weight" if weight.dtype is not dtype else "residual"
        raise TypeError(f"{name} has dtype {dict(named)[name].dtype} but x has {dtype}: "
                        "they must match")
    if out_dtype is None:
        out_dtype = dtype if out is None else out.dtype
    elif out is not None and out.dtype is not out_dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
    if out_dtype not in DTYPE_NAMES:
        raise TypeError(f"out_dtype {out_dtype} is not supported: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    shape = x.shape
    if len(shape) != 2:
        raise ValueError(f"x must be (rows, hidden), got shape {tuple(shape)}")
    rows, hidden = shape
    if not MIN_HIDDEN <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden size {hidden} is not supported: use {MIN_HIDDEN} to "
                         f"{MAX_HIDDEN}")
    in_bytes, out_bytes = DTYPE_BYTES[DTYPE_NAMES[dtype]], DTYPE_BYTES[DTYPE_NAMES[out_dtype]]
    widest = max(in_bytes, out_bytes)
    # The narrowest vector (one 32-bit word of the widest dtype) must divide the row.
    word = MIN_VECTOR_BITS // 8 // widest
    if hidden % word:
        raise ValueError(f"hidden size {hidden} must be a multiple of {word} for {dtype} in, "
                         f"{out_dtype} out (the narrowest vector)")
    if (residual is not None and residual.shape != shape) or (
            out is not None and out.shape != shape):
        name = "residual" if residual is not None and residual.shape != shape else "out"
        raise ValueError(f"{name} has shape {tuple(dict(named)[name].shape)} but x has "
                         f"{tuple(shape)}")
    if weight.shape != (hidden,) or weight.stride() != (1,):
        raise ValueError(f"weight must be a contiguous ({hidden},) vector, got shape "
                         f"{tuple(weight.shape)} and strides {weight.stride()}")
    x_stride = x.stride()
    r_stride = x_stride if residual is None else residual.stride()
    o_stride = x_stride if out is None else out.stride()
    if (x_stride[1] != 1 or r_stride[1] != 1 or o_stride[1] != 1 or rows > 1 and (
            x_stride[0] < hidden or r_stride[0] < hidden or o_stride[0] < hidden)):
        raise ValueError(f"x, residual and out must have contiguous, non-overlapping rows "
                         f"(strides (>= {hidden}, 1)), got "
                         + _row_strides(named))
    # Every config's vector divides this (a power of two dividing the row, at most 16 bytes of
    # the widest dtype): row starts and strides aligned to it keep every access whole.
    align = math.gcd(hidden, _VECTOR_BYTES // widest)
    if ((x_stride[0] | r_stride[0] | o_stride[0]) % align
            or (x.data_ptr() | (0 if residual is None else residual.data_ptr())
                | weight.data_ptr()) % (align * in_bytes)
            or (0 if out is None else out.data_ptr()) % (align * out_bytes)):
        raise ValueError(f"x, residual, weight and out must start aligned to {align} elements "
                         f"and their row strides must be multiples of {align} elements (the "
                         f"widest vector that divides hidden size {hidden}), got strides "
                         + _row_strides(named))
    return out_dtype, device_index("rmsnorm", "x", x, named[1:])


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_bias: float = 0.0,
            out_dtype: torch.dtype | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of every row of x (rows, hidden): out = (w + weight_bias) * x *
    rsqrt(mean(x^2) + eps), computed in fp32, written in out_dtype (default: out's dtype, else
    x's), in one launch on the current stream. `out` may be x itself (in place).

    x's rows may be strided (last dimension contiguous). The kernel is the winner tuned for
    this device and row-count bucket when `cutetune.warmup` loaded one, else the heuristic
    default. On CPU tensors the op computes with the kernel's fp32 reference instead (same
    output dtype and in-place writes; cutetune.ops.cpu). Under torch.compile the call is the
    custom op cutetune::rmsnorm."""
    # The plain form passes x as its residual (the kernel ignores it).
    return _RMSNORM((x, x, weight, out, eps, weight_bias, False, out_dtype))


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, weight_bias: float = 0.0,
                      out_dtype: torch.dtype | None = None,
                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fused_add_rms_norm: residual += x in place (rounded to x's dtype), then out =
    RMSNorm of that sum as in `rmsnorm`. Returns (out, residual). `out` may be x itself.
    Under torch.compile the call is the custom op cutetune::rmsnorm."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    return _RMSNORM((x, residual, weight, out, eps, weight_bias, True, out_dtype)), residual


def _allocated(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: None,
               eps: float, weight_bias: float, fused_add: bool,
               out_dtype: torch.dtype | None) -> tuple[tuple, torch.Tensor]:
    out = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    return (x, residual, weight, out, eps, weight_bias, fused_add, out_dtype), out


def _checked(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
             out: torch.Tensor | None, eps: float, weight_bias: float, fused_add: bool,
             out_dtype: torch.dtype | None, allocated: torch.Tensor | None) -> Checked:
    given_residual = residual if fused_add else None
    resolved_dtype, device = _check_inputs(x, given_residual, weight, out, out_dtype)
    check_norm_scalars(eps, weight_bias)
    rows, hidden = x.shape
    if out is None:
        out = (torch.empty((rows, hidden), dtype=resolved_dtype, device=x.device)
               if allocated is None else allocated)
    if rows == 0:
        return Checked(out)
    static = RMSNormProblem.static_tuple_of(
        dtype=DTYPE_NAMES[x.dtype], out_dtype=DTYPE_NAMES[resolved_dtype], hidden=hidden,
        eps=float(eps), weight_bias=float(weight_bias), fused_add=fused_add)
    return Checked(out, (x, residual, weight, out, eps, weight_bias, fused_add, out_dtype),
                   static, rows, device)


def _traced(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
            out: torch.Tensor | None, eps: float, weight_bias: float, fused_add: bool,
            out_dtype: torch.dtype | None) -> torch.Tensor:
    """The call as torch.compile records it: `out` allocated here, then the custom op writes
    it (the plain form passes no residual, so that x is not taken for written)."""
    if out is None:
        out = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    torch.ops.cutetune.rmsnorm(x, residual if fused_add else None, weight, out, eps,
                               weight_bias)
    return out


def _rmsnorm_into(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                  out: torch.Tensor, eps: float, weight_bias: float) -> None:
    _RMSNORM((x, x if residual is None else residual, weight, out, eps, weight_bias,
              residual is not None, None))


def _calls(t, problem: RMSNormProblem):
    if problem.fused_add:
        return {"fused_add_rmsnorm": lambda: fused_add_rmsnorm(
            t["x"], t["residual"], t["weight"], eps=problem.eps,
            weight_bias=problem.weight_bias, out=t["out"])}
    return {"rmsnorm": lambda: rmsnorm(t["x"], t["weight"], eps=problem.eps,
                                       weight_bias=problem.weight_bias, out=t["out"])}


# The kernel does not check that the rows it writes do not overlap: the route does. The key
# holds out_dtype as given, so a call whose out_dtype and out disagree is never served by it.
_RMSNORM = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("x", "residual", "weight", "out", "eps", "weight_bias", "fused_add",
                   "out_dtype"), launched=4,
        tokens=Dim("x", 0),
        fields={"dtype": DType("x"), "out_dtype": DType("out"), "hidden": Dim("x", 1),
                "eps": Value("eps"), "weight_bias": Value("weight_bias"),
                "fused_add": Value("fused_add")},
        disjoint_rows=("x", "residual", "out"), keyed=("out_dtype",)),
    check=_checked,
    functions=(rmsnorm, fused_add_rmsnorm),
    custom_ops=(CustomOp("rmsnorm", _rmsnorm_into, mutates=("residual", "out")),),
    calls=_calls,
    output="out",
    prepare=_allocated,
    traced=_traced,
    writes=lambda problem: ("residual", "out") if problem.fused_add else ("out",),
))
