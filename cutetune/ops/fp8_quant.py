"""cutetune.fp8_group_quant, cutetune.silu_and_mul_fp8_quant, cutetune.rmsnorm_fp8_quant and
cutetune.fused_add_rmsnorm_fp8_quant: FP8 per-token-group quantisation, alone or fused with the
activation or the norm before it; each returns (q, scales) (and the fused add its residual).

q is (tokens, W) float8_e4m3fn, scales fp32 (tokens, W / group_size): row-major, or with
column_major_scales=True column-major, element [t, g] at t + g * stride (allocated with the
stride padded to a multiple of 4 tokens, the TMA-aligned layout DeepGEMM reads; a given
`scales` may have any stride of at least the tokens). ue8m0=True makes the scales powers of two.
cutetune.kernels.fp8_quant defines the values exactly (the 1e-10 amax floor, saturation, NaN and
infinity).
"""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.fp8_group_quant import QUANT_KERNEL, SILU_QUANT_KERNEL, kernel_scales
from cutetune.kernels.fp8_quant import FP8_DTYPE, GROUP_SIZES, QUANT_DTYPES, empty_scales
from cutetune.kernels.registry import KernelDef
from cutetune.kernels.rmsnorm_fp8_quant import KERNEL as NORM_KERNEL
from cutetune.ops.checks import (
    check_bool,
    check_choice,
    check_norm_scalars,
    check_positive_size,
    device_index,
)
from cutetune.ops.registry import Checked, CustomOp, OpDef, register
from cutetune.ops.rmsnorm import _check_inputs as _check_norm_inputs

_VECTOR_BYTES = 16


def _check_rows(name: str, t: torch.Tensor, element_bytes: int, width: int) -> None:
    stride = t.stride()
    if stride[1] != 1 or (t.shape[0] > 1 and stride[0] < width):
        raise ValueError(f"{name} must have contiguous, non-overlapping rows (strides "
                         f"(>= {width}, 1)), got strides {stride}")
    if stride[0] * element_bytes % _VECTOR_BYTES or t.data_ptr() % _VECTOR_BYTES:
        raise ValueError(f"{name} must start 16-byte aligned and its row stride ({stride[0]} "
                         "elements) must be a multiple of 16 bytes")


def check_quant_scalars(group_size: object, column_major_scales: object, ue8m0: object) -> None:
    """One clear error for the first thing wrong with the quantisation's scalar arguments
    (every op that quantises to FP8 groups takes them)."""
    check_choice("group_size", group_size, GROUP_SIZES)
    check_bool("column_major_scales", column_major_scales)
    check_bool("ue8m0", ue8m0)


def _check_quant_args(x: object, group_size: object, column_major_scales: object,
                      ue8m0: object, width_of) -> tuple[str, int, int]:
    """x's dtype name, token count and the quantised width (width_of(x's last dim)); one clear
    error for the first thing wrong with x or the quantisation's arguments."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPE_NAMES or DTYPE_NAMES[x.dtype] not in QUANT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}: use torch.bfloat16 or torch.float16")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-d (tokens, width), got shape {tuple(x.shape)}")
    check_positive_size("x's width (x.shape[1])", x.shape[1])
    check_quant_scalars(group_size, column_major_scales, ue8m0)
    name = DTYPE_NAMES[x.dtype]
    tokens, width = x.shape[0], width_of(x.shape[1])
    if width % group_size:
        raise ValueError(f"x's quantised width {width} must be a multiple of group_size "
                         f"{group_size}")
    _check_rows("x", x, DTYPE_BYTES[name], x.shape[1])
    return name, tokens, width


def _check_outputs(x: torch.Tensor, out: torch.Tensor | None, scales: torch.Tensor | None,
                   tokens: int, width: int, group_size: int, column_major: bool) -> None:
    """One clear error for the first thing wrong with a given `out` or `scales`; devices
    last."""
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype is not FP8_DTYPE:
            raise TypeError(f"out has dtype {out.dtype}: it must be torch.float8_e4m3fn")
        if tuple(out.shape) != (tokens, width):
            raise ValueError(f"out must have shape {(tokens, width)}, got {tuple(out.shape)}")
        _check_rows("out", out, 1, width)
    if scales is not None:
        groups = width // group_size
        if not isinstance(scales, torch.Tensor):
            raise TypeError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
        if scales.dtype is not torch.float32:
            raise TypeError(f"scales has dtype {scales.dtype}: it must be torch.float32")
        if tuple(scales.shape) != (tokens, groups):
            raise ValueError(f"scales must have shape {(tokens, groups)} (tokens, width / "
                             f"group_size), got {tuple(scales.shape)}")
        stride = scales.stride()
        if column_major and (stride[0] != 1 or (groups > 1 and stride[1] < tokens)):
            raise ValueError(f"scales must be column-major (strides (1, >= {tokens})) with "
                             f"column_major_scales=True, got strides {stride}")
        if not column_major and (stride[1] != 1 or (tokens > 1 and stride[0] < groups)):
            raise ValueError(f"scales must be row-major (strides (>= {groups}, 1)) with "
                             f"column_major_scales=False, got strides {stride}")
    device_index("the FP8 quantisation", "x", x, (("out", out), ("scales", scales)))


def _outputs(x: torch.Tensor, tokens: int, width: int, group_size: int, column_major: bool,
             out: torch.Tensor | None, scales: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None:
        out = torch.empty(tokens, width, dtype=FP8_DTYPE, device=x.device)
    if scales is None:
        scales = empty_scales(tokens, width // group_size, column_major, x.device)
    return out, scales


# ---------------------------------------------------------------------------------------------
# fp8_group_quant and silu_and_mul_fp8_quant: one op shape, x -> (q, scales)


def fp8_group_quant(x: torch.Tensor, group_size: int = 128, column_major_scales: bool = False,
                    ue8m0: bool = False, out: torch.Tensor | None = None,
                    scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (tokens, hidden) bf16/fp16 quantised to FP8 e4m3 with one fp32 scale per group of
    `group_size` (64 or 128) elements of a row: returns (q, scales), written into `out` and
    `scales` where given (allocated otherwise), in one launch on the current stream.

    x's rows may be strided (a multiple of 16 bytes, last dimension contiguous). The kernel is
    the winner tuned for this device and token bucket when `cutetune.warmup` loaded one, else
    the heuristic default. On CPU tensors the op computes with the kernel's torch reference
    (cutetune.ops.cpu). Under torch.compile the call is the custom op cutetune::fp8_group_quant
    (cutetune::fp8_group_quant_into with out and scales)."""
    return _FP8_GROUP_QUANT((x, out, scales, group_size, column_major_scales, ue8m0))


def silu_and_mul_fp8_quant(x: torch.Tensor, group_size: int = 128,
                           column_major_scales: bool = False, ue8m0: bool = False,
                           out: torch.Tensor | None = None, scales: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(x[:, :I]) * x[:, I:] of x (tokens, 2I), rounded to x's dtype, quantised as
    `fp8_group_quant` quantises: (q (tokens, I), scales), the bytes silu_and_mul followed by
    fp8_group_quant writes, in one launch. Otherwise as `fp8_group_quant` (under torch.compile:
    cutetune::silu_and_mul_fp8_quant)."""
    return _SILU_AND_MUL_FP8_QUANT((x, out, scales, group_size, column_major_scales, ue8m0))


def _rows_op(kernel: KernelDef, width_field: str, width_of, function):
    """The pieces of the op of `kernel` (x -> q, scales), whose problem's width field is
    `width_field`, width_of(x's last dim) of x."""

    def prepared(x, out, scales, group_size, column_major, ue8m0):
        out, scales = _outputs(x, x.shape[0], width_of(x.shape[1]), group_size, column_major,
                               out, scales)
        return ((x, out, kernel_scales(scales, column_major), group_size, column_major, ue8m0),
                (out, scales))

    def checked(x, out, scales, group_size, column_major, ue8m0, allocated) -> Checked:
        dtype, tokens, width = _check_quant_args(x, group_size, column_major, ue8m0, width_of)
        _check_outputs(x, out, scales, tokens, width, group_size, column_major)
        if allocated is not None:
            out, scales = allocated
        out, scales = _outputs(x, tokens, width, group_size, column_major, out, scales)
        if tokens == 0:
            return Checked((out, scales))
        static = kernel.problem_type.static_tuple_of(
            dtype=dtype, group_size=group_size, column_major_scales=column_major, ue8m0=ue8m0,
            **{width_field: width})
        return Checked((out, scales), (x, out, kernel_scales(scales, column_major), group_size,
                                       column_major, ue8m0), static, tokens, x.get_device())

    def allocating(x: torch.Tensor, group_size: int, column_major_scales: bool,
                   ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = function(x, group_size, column_major_scales, ue8m0)
        return q, scales

    def shapes(x, group_size, column_major_scales, ue8m0):
        return _outputs(x, x.shape[0], width_of(x.shape[1]), group_size, column_major_scales,
                        None, None)

    def into(x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, group_size: int,
             column_major_scales: bool, ue8m0: bool) -> None:
        function(x, group_size, column_major_scales, ue8m0, out, scales)

    def traced(x, out, scales, group_size, column_major, ue8m0):
        if out is None and scales is None:
            return getattr(torch.ops.cutetune, kernel.name)(x, group_size, column_major, ue8m0)
        out, scales = _outputs(x, x.shape[0], width_of(x.shape[1]), group_size, column_major,
                               out, scales)
        getattr(torch.ops.cutetune, f"{kernel.name}_into")(x, out, scales, group_size,
                                                           column_major, ue8m0)
        return out, scales

    def calls(t, problem):
        scales = t["scales"]
        given = scales.t() if problem.column_major_scales else scales
        quant = {"group_size": problem.group_size,
                 "column_major_scales": problem.column_major_scales, "ue8m0": problem.ue8m0}
        return {kernel.name: lambda: function(t["x"], **quant),
                f"{kernel.name} into buffers": lambda: function(t["x"], **quant, out=t["q"],
                                                                scales=given)}

    return register(OpDef(
        kernel=kernel,
        fast_call=FastCall(
            arguments=("x", "q", "scales", "group_size", "column_major_scales", "ue8m0"),
            launched=3, tokens=Dim("x", 0),
            fields={"dtype": DType("x"), width_field: Dim("x", 1),
                    "group_size": Value("group_size"),
                    "column_major_scales": Value("column_major_scales"),
                    "ue8m0": Value("ue8m0")},
            disjoint_rows=("q", "scales")),
        check=checked,
        functions=(function,),
        custom_ops=(CustomOp(kernel.name, allocating, fake=shapes),
                    CustomOp(f"{kernel.name}_into", into, mutates=("out", "scales"))),
        calls=calls,
        prepare=prepared,
        traced=traced,
        returned=_returned_quant,
    ))


def _returned_quant(result: tuple[torch.Tensor, torch.Tensor], problem) -> dict:
    """A call's (q, scales), the scales as the kernel's `scales` holds them."""
    q, scales = result
    return {"q": q, "scales": kernel_scales(scales, problem.column_major_scales)}


def _halved(width: int) -> int:
    if width % 2:
        raise ValueError(f"x must be (tokens, 2 * intermediate) with an even last dim, got "
                         f"{width}")
    return width // 2


_FP8_GROUP_QUANT = _rows_op(QUANT_KERNEL, "hidden", lambda width: width, fp8_group_quant)
_SILU_AND_MUL_FP8_QUANT = _rows_op(SILU_QUANT_KERNEL, "intermediate", _halved,
                                   silu_and_mul_fp8_quant)


# ---------------------------------------------------------------------------------------------
# rmsnorm_fp8_quant and fused_add_rmsnorm_fp8_quant: one op, the kernel's plain and fused forms


def rmsnorm_fp8_quant(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      weight_bias: float = 0.0, group_size: int = 128,
                      column_major_scales: bool = False, ue8m0: bool = False,
                      out: torch.Tensor | None = None, scales: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """cutetune.rmsnorm of x (tokens, hidden), in x's dtype, quantised as `fp8_group_quant`
    quantises: (q, scales), the bytes rmsnorm followed by fp8_group_quant writes, in one
    launch. Under torch.compile the call is the custom op cutetune::rmsnorm_fp8_quant
    (cutetune::rmsnorm_fp8_quant_into with out and scales)."""
    return _RMSNORM_FP8_QUANT((x, x, weight, out, scales, eps, weight_bias, False, group_size,
                               column_major_scales, ue8m0))


def fused_add_rmsnorm_fp8_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float = 1e-6, weight_bias: float = 0.0,
                                group_size: int = 128, column_major_scales: bool = False,
                                ue8m0: bool = False, out: torch.Tensor | None = None,
                                scales: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's fused_add_rms_norm (residual += x in place, rounded to x's dtype, then the
    RMSNorm of that sum), quantised as `fp8_group_quant` quantises: returns (q, scales,
    residual), the bytes fused_add_rmsnorm followed by fp8_group_quant writes, in one launch."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    q, scales = _RMSNORM_FP8_QUANT((x, residual, weight, out, scales, eps, weight_bias, True,
                                    group_size, column_major_scales, ue8m0))
    return q, scales, residual


def _norm_prepared(x, residual, weight, out, scales, eps, weight_bias, fused_add, group_size,
                   column_major, ue8m0):
    out, scales = _outputs(x, x.shape[0], x.shape[1], group_size, column_major, out, scales)
    return ((x, residual, weight, out, kernel_scales(scales, column_major), eps, weight_bias,
             fused_add, group_size, column_major, ue8m0), (out, scales))


def _norm_checked(x, residual, weight, out, scales, eps, weight_bias, fused_add, group_size,
                  column_major, ue8m0, allocated) -> Checked:
    dtype, tokens, hidden = _check_quant_args(x, group_size, column_major, ue8m0, int)
    _check_norm_inputs(x, residual if fused_add else None, weight, None, None)
    check_norm_scalars(eps, weight_bias)
    _check_outputs(x, out, scales, tokens, hidden, group_size, column_major)
    if allocated is not None:
        out, scales = allocated
    out, scales = _outputs(x, tokens, hidden, group_size, column_major, out, scales)
    if tokens == 0:
        return Checked((out, scales))
    static = NORM_KERNEL.problem_type.static_tuple_of(
        dtype=dtype, hidden=hidden, eps=float(eps), weight_bias=float(weight_bias),
        fused_add=fused_add, group_size=group_size, column_major_scales=column_major,
        ue8m0=ue8m0)
    return Checked((out, scales), (x, residual, weight, out, kernel_scales(scales, column_major),
                                   eps, weight_bias, fused_add, group_size, column_major, ue8m0),
                   static, tokens, x.get_device())


def _norm_quant(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float, weight_bias: float, group_size: int, column_major_scales: bool,
                ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    quant = (group_size, column_major_scales, ue8m0)
    if residual is None:
        return rmsnorm_fp8_quant(x, weight, eps, weight_bias, *quant)
    return fused_add_rmsnorm_fp8_quant(x, residual, weight, eps, weight_bias, *quant)[:2]


def _norm_shapes(x, residual, weight, eps, weight_bias, group_size, column_major_scales,
                 ue8m0):
    return _outputs(x, x.shape[0], x.shape[1], group_size, column_major_scales, None, None)


def _norm_quant_into(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     out: torch.Tensor, scales: torch.Tensor, eps: float, weight_bias: float,
                     group_size: int, column_major_scales: bool, ue8m0: bool) -> None:
    _RMSNORM_FP8_QUANT((x, x if residual is None else residual, weight, out, scales, eps,
                        weight_bias, residual is not None, group_size, column_major_scales,
                        ue8m0))


def _norm_traced(x, residual, weight, out, scales, eps, weight_bias, fused_add, group_size,
                 column_major, ue8m0):
    """The call as torch.compile records it (the plain form passes no residual, so that x is
    not taken for written)."""
    residual = residual if fused_add else None
    if out is None and scales is None:
        return torch.ops.cutetune.rmsnorm_fp8_quant(x, residual, weight, eps, weight_bias,
                                                    group_size, column_major, ue8m0)
    out, scales = _outputs(x, x.shape[0], x.shape[1], group_size, column_major, out, scales)
    torch.ops.cutetune.rmsnorm_fp8_quant_into(x, residual, weight, out, scales, eps,
                                              weight_bias, group_size, column_major, ue8m0)
    return out, scales


def _norm_calls(t, problem):
    quant = {"group_size": problem.group_size,
             "column_major_scales": problem.column_major_scales, "ue8m0": problem.ue8m0}
    scales = t["scales"].t() if problem.column_major_scales else t["scales"]
    if problem.fused_add:
        return {"fused_add_rmsnorm_fp8_quant": lambda: fused_add_rmsnorm_fp8_quant(
            t["x"], t["residual"], t["weight"], problem.eps, problem.weight_bias, **quant,
            out=t["q"], scales=scales)}
    return {"rmsnorm_fp8_quant": lambda: rmsnorm_fp8_quant(
        t["x"], t["weight"], problem.eps, problem.weight_bias, **quant, out=t["q"],
        scales=scales)}


_RMSNORM_FP8_QUANT = register(OpDef(
    kernel=NORM_KERNEL,
    fast_call=FastCall(
        arguments=("x", "residual", "weight", "q", "scales", "eps", "weight_bias", "fused_add",
                   "group_size", "column_major_scales", "ue8m0"), launched=5,
        tokens=Dim("x", 0),
        fields={"dtype": DType("x"), "hidden": Dim("x", 1), "eps": Value("eps"),
                "weight_bias": Value("weight_bias"), "fused_add": Value("fused_add"),
                "group_size": Value("group_size"),
                "column_major_scales": Value("column_major_scales"), "ue8m0": Value("ue8m0")},
        disjoint_rows=("x", "residual", "q", "scales")),
    check=_norm_checked,
    functions=(rmsnorm_fp8_quant, fused_add_rmsnorm_fp8_quant),
    custom_ops=(CustomOp("rmsnorm_fp8_quant", _norm_quant, mutates=("residual",),
                         fake=_norm_shapes),
                CustomOp("rmsnorm_fp8_quant_into", _norm_quant_into,
                         mutates=("residual", "out", "scales"))),
    calls=_norm_calls,
    prepare=_norm_prepared,
    traced=_norm_traced,
    writes=lambda problem: ("residual", "q", "scales") if problem.fused_add else ("q", "scales"),
))
