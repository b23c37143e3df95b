"""cutetune.qk_norm_rope: per-head RMSNorm then rotary embedding of q and k, in place."""

from __future__ import annotations

import dataclasses

import torch

from cutetune.fast_call import Constant, Dim, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.kernels.qk_norm_rope import KERNEL, UNSERVED_ROPE_FIELDS, QKNormRopeProblem
from cutetune.kernels.rope import DEFAULT, GPTJ, MROPE_NONE, NEOX, RopeProblem
from cutetune.ops import qk_norm as qk_norm_op
from cutetune.ops import rope as rope_op
from cutetune.ops.checks import check_norm_scalars
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

# The scalar arguments after the tensors, and what the fast path reads of every argument: the
# op's, and those of the ops that take its arguments and more (qk_norm_rope_kv).
SCALARS = ("rope_theta", "eps", "weight_bias", "is_neox", "scaling", "scaling_factor",
           "low_freq_factor", "high_freq_factor", "original_max_position")
FIELDS = {**rope_op.ROTATION_FIELDS, "eps": Value("eps"), "weight_bias": Value("weight_bias"),
          # rope's YaRN and mrope fields, which this kernel refuses: every call has
          # their defaults.
          **{f.name: Constant(f.default) for f in dataclasses.fields(RopeProblem)
             if f.name in UNSERVED_ROPE_FIELDS}}


def qk_norm_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
                 rope_theta: float, eps: float = 1e-6, weight_bias: float = 0.0,
                 is_neox: bool = True, scaling: str = DEFAULT, scaling_factor: float = 1.0,
                 low_freq_factor: float = 1.0, high_freq_factor: float = 1.0,
                 original_max_position: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cutetune.qk_norm, then cutetune.rope, of q (tokens, q_heads, head_dim) and k (tokens,
    kv_heads, head_dim) in place, in one launch on the current stream: every head normalised,
    y = (w + weight_bias) * x * rsqrt(mean(x^2) + eps), then its first rotary_dim elements
    rotated by the angles of `positions` (tokens,), int32 or int64.

    The arguments are those two ops' (their docstrings say them in full): q_weight and k_weight
    (head_dim,) in q's dtype; cos_sin_cache vLLM's (max_position, rotary_dim), whose width is
    rotary_dim, agreeing with rope_theta and the scaling; NeoX style where `is_neox`, else
    GPT-J. q and k may be views into a fused qkv tensor. On CPU tensors the op computes with the
    kernel's reference instead. Under torch.compile the call is the custom op
    cutetune::qk_norm_rope (no graph break)."""
    _QK_NORM_ROPE((positions, q, k, q_weight, k_weight, cos_sin_cache, rope_theta, eps,
                   weight_bias, is_neox, scaling, scaling_factor, low_freq_factor,
                   high_freq_factor, original_max_position))
    return q, k


def _checked(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
             k_weight: torch.Tensor, cos_sin_cache: torch.Tensor, rope_theta: float, eps: float,
             weight_bias: float, is_neox: bool, scaling: str, scaling_factor: float,
             low_freq_factor: float, high_freq_factor: float, original_max_position: int,
             allocated: None) -> Checked:
    # rope's checks, then qk_norm's of the weights: one error for the first thing wrong.
    device = rope_op._check_inputs(positions, q, k, cos_sin_cache, rope_theta, MROPE_NONE)
    qk_norm_op._check_inputs(q, k, q_weight, k_weight)
    rope_op.check_rotation(is_neox, scaling_factor, low_freq_factor, high_freq_factor,
                           original_max_position)
    check_norm_scalars(eps, weight_bias)
    # The problem's own checks name the scalar arguments (the fields have their names).
    problem = QKNormRopeProblem(
        num_tokens=max(1, q.shape[0]), dtype=DTYPE_NAMES[q.dtype], head_dim=q.shape[2],
        rotary_dim=cos_sin_cache.shape[1], q_heads=q.shape[1], kv_heads=k.shape[1],
        style=NEOX if is_neox else GPTJ,
        positions_dtype=rope_op.POSITION_DTYPE_NAMES[positions.dtype],
        cache_dtype=DTYPE_NAMES[cos_sin_cache.dtype], theta=float(rope_theta), scaling=scaling,
        scaling_factor=float(scaling_factor), low_freq_factor=float(low_freq_factor),
        high_freq_factor=float(high_freq_factor), original_max_position=original_max_position,
        eps=float(eps), weight_bias=float(weight_bias))
    tokens = q.shape[0]
    if tokens == 0:
        return Checked(None)
    return Checked(None, (positions, q, k, q_weight, k_weight, cos_sin_cache, rope_theta, eps,
                          weight_bias, is_neox, scaling, scaling_factor, low_freq_factor,
                          high_freq_factor, original_max_position),
                   problem.static_tuple(), tokens, device)


def _qk_norm_rope_op(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     q_weight: torch.Tensor, k_weight: torch.Tensor,
                     cos_sin_cache: torch.Tensor, rope_theta: float, eps: float,
                     weight_bias: float, is_neox: bool, scaling: str, scaling_factor: float,
                     low_freq_factor: float, high_freq_factor: float,
                     original_max_position: int) -> None:
    """The custom op's body: the eager op (a compiled graph runs it, not compiling)."""
    qk_norm_rope(positions, q, k, q_weight, k_weight, cos_sin_cache, rope_theta, eps,
                 weight_bias, is_neox, scaling, scaling_factor, low_freq_factor,
                 high_freq_factor, original_max_position)


_QK_NORM_ROPE = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("positions", "q", "k", "q_weight", "k_weight", "cos_sin_cache", *SCALARS),
        launched=6, tokens=Dim("q", 0),
        fields=FIELDS,
        # The key holds no row count: a cache without rows must reach the checks.
        nonempty=(Dim("cos_sin_cache", 0),)),
    check=_checked,
    functions=(qk_norm_rope,),
    custom_ops=(CustomOp("qk_norm_rope", _qk_norm_rope_op, mutates=("q", "k")),),
    calls=lambda t, problem: {"qk_norm_rope": lambda: qk_norm_rope(
        t["positions"], t["q"], t["k"], t["q_weight"], t["k_weight"], t["cos_sin_cache"],
        problem.theta, problem.eps, problem.weight_bias, problem.style == NEOX,
        problem.scaling, problem.scaling_factor, problem.low_freq_factor,
        problem.high_freq_factor, problem.original_max_position)},
))
