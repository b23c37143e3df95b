"""cutetune.qk_norm: per-head RMSNorm of q and k in place."""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.qk_norm import HEAD_DIMS, KERNEL, QKNormProblem
from cutetune.ops.checks import check_norm_scalars, device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register


def _check_inputs(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                  k_weight: torch.Tensor) -> int:
    """Raise one clear error for the first thing wrong with the inputs; return q's CUDA
    device index (-1: the CPU).

    The valid case reads each attribute once (every tensor attribute read costs host time,
    and this runs on every call); naming the offending tensor is left to the error path."""
    named = (("q", q), ("k", k), ("q_weight", q_weight), ("k_weight", k_weight))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = q.dtype
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"q has dtype {dtype}: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if not (k.dtype is dtype and q_weight.dtype is dtype and k_weight.dtype is dtype):
        name = next(n for n, t in named if t.dtype is not dtype)
        raise TypeError(f"{name} has dtype {dict(named)[name].dtype} but q has {dtype}: "
                        "they must match")
    device = device_index("qk_norm", "q", q, named[1:])
    q_shape, k_shape = tuple(q.shape), tuple(k.shape)
    if len(q_shape) != 3 or len(k_shape) != 3:
        raise ValueError(f"q and k must be (tokens, heads, head_dim), got shapes {q_shape} "
                         f"and {k_shape}")
    d = q_shape[2]
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported: use one of {HEAD_DIMS}")
    if k_shape[0] != q_shape[0] or k_shape[2] != d:
        raise ValueError(f"k {k_shape} must have q's tokens and head_dim (q is {q_shape})")
    if tuple(q_weight.shape) != (d,) or tuple(k_weight.shape) != (d,) or not (
            q_weight.is_contiguous() and k_weight.is_contiguous()):
        raise ValueError(f"q_weight and k_weight must be contiguous ({d},) vectors, got "
                         f"shapes {tuple(q_weight.shape)} and {tuple(k_weight.shape)}")
    q_stride, k_stride = q.stride(), k.stride()
    if q_stride[1:] != (d, 1) or k_stride[1:] != (d, 1):
        raise ValueError(f"the heads of q and k must be contiguous (strides (*, {d}, 1)), got "
                         f"{q_stride} and {k_stride}")
    token_stride_bytes = (q_stride[0] | k_stride[0]) * DTYPE_BYTES[DTYPE_NAMES[dtype]]
    if (q.data_ptr() | k.data_ptr() | q_weight.data_ptr() | k_weight.data_ptr()
            | token_stride_bytes) % 16:
        raise ValueError("q, k and the weights must start 16-byte aligned, and the token "
                         f"strides of q and k ({q_stride[0]}, {k_stride[0]} elements) must be "
                         "multiples of 16 bytes")
    return device


def qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
            eps: float = 1e-6, weight_bias: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise every head of q (tokens, q_heads, d) and k (tokens, kv_heads, d) in place:
    y = (w + weight_bias) * x * rsqrt(mean(x^2) + eps), in one launch on the current stream.

    q and k may be views into a fused qkv tensor. The kernel is the winner tuned for this
    device and token bucket when `cutetune.warmup` loaded one, else the heuristic default.
    On CPU tensors the op computes with the kernel's fp32 reference instead (cutetune.ops.cpu).
    Under torch.compile the call is the custom op cutetune::qk_norm (no graph break)."""
    _QK_NORM((q, k, q_weight, k_weight, eps, weight_bias))
    return q, k


def _checked(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
             eps: float, weight_bias: float, allocated: None) -> Checked:
    device = _check_inputs(q, k, q_weight, k_weight)
    check_norm_scalars(eps, weight_bias)
    tokens = q.shape[0]
    if tokens == 0:
        return Checked(None)
    static = QKNormProblem.static_tuple_of(
        dtype=DTYPE_NAMES[q.dtype], head_dim=q.shape[2], q_heads=q.shape[1],
        kv_heads=k.shape[1], eps=float(eps), weight_bias=float(weight_bias))
    return Checked(None, (q, k, q_weight, k_weight, eps, weight_bias), static, tokens, device)


def _qk_norm_op(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                k_weight: torch.Tensor, eps: float, weight_bias: float) -> None:
    """The custom op's body: the eager op (a compiled graph runs it, not compiling)."""
    qk_norm(q, k, q_weight, k_weight, eps, weight_bias)


_QK_NORM = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("q", "k", "q_weight", "k_weight", "eps", "weight_bias"), launched=4,
        tokens=Dim("q", 0),
        fields={"dtype": DType("q"), "head_dim": Dim("q", 2), "q_heads": Dim("q", 1),
                "kv_heads": Dim("k", 1), "eps": Value("eps"),
                "weight_bias": Value("weight_bias")}),
    check=_checked,
    functions=(qk_norm,),
    custom_ops=(CustomOp("qk_norm", _qk_norm_op, mutates=("q", "k")),),
    calls=lambda t, problem: {"qk_norm": lambda: qk_norm(
        t["q"], t["k"], t["q_weight"], t["k_weight"], eps=problem.eps,
        weight_bias=problem.weight_bias)},
))
