"""cutetune: autotuning and specialisation of CuTeDSL inference kernels.

    import cutetune
    cutetune.warmup("qwen3-8b")              # load this GPU's tuned winners, compile them
    cutetune.qk_norm(q, k, q_weight, k_weight, eps=1e-6)
    out, residual = cutetune.fused_add_rmsnorm(x, residual, weight, eps=1e-6)
    h = cutetune.silu_and_mul(gate_up)

The ops (cutetune.ops) import their kernel module (and CuTeDSL) on first use.
"""

from cutetune.dispatch import current_dispatcher, warmup
from cutetune.version import __version__


def qk_norm(q, k, q_weight, k_weight, eps: float = 1e-6, weight_bias: float = 0.0):
    """Per-head RMSNorm of q and k in place; see cutetune.ops.qk_norm.qk_norm."""
    from cutetune.ops.qk_norm import qk_norm as _qk_norm

    return _qk_norm(q, k, q_weight, k_weight, eps=eps, weight_bias=weight_bias)


def rmsnorm(x, weight, eps: float = 1e-6, weight_bias: float = 0.0, out_dtype=None, out=None):
    """RMSNorm of each row of x; see cutetune.ops.rmsnorm.rmsnorm."""
    from cutetune.ops.rmsnorm import rmsnorm as _rmsnorm

    return _rmsnorm(x, weight, eps=eps, weight_bias=weight_bias, out_dtype=out_dtype, out=out)


def fused_add_rmsnorm(x, residual, weight, eps: float = 1e-6, weight_bias: float = 0.0,
                      out_dtype=None, out=None):
    """residual += x in place, then RMSNorm of it; see cutetune.ops.rmsnorm."""
    from cutetune.ops.rmsnorm import fused_add_rmsnorm as _fused

    return _fused(x, residual, weight, eps=eps, weight_bias=weight_bias, out_dtype=out_dtype,
                  out=out)


def silu_and_mul(x, out=None):
    """silu(x[:, :I]) * x[:, I:]; see cutetune.ops.activation.silu_and_mul."""
    from cutetune.ops.activation import silu_and_mul as _silu_and_mul

    return _silu_and_mul(x, out=out)


def gelu_and_mul(x, approximate: str = "none", out=None):
    """gelu(x[:, :I]) * x[:, I:]; see cutetune.ops.activation.gelu_and_mul."""
    from cutetune.ops.activation import gelu_and_mul as _gelu_and_mul

    return _gelu_and_mul(x, approximate=approximate, out=out)


def moe_dispatch(x, topk_ids, num_experts: int, pad: int = 16, expert_range=None,
                 validate: bool = False):
    """Route (token, k) pairs to per-expert row segments; see cutetune.ops.moe_dispatch."""
    from cutetune.ops.moe_dispatch import moe_dispatch as _moe_dispatch

    return _moe_dispatch(x, topk_ids, num_experts, pad=pad, expert_range=expert_range,
                         validate=validate)


def moe_combine(expert_out, row_of, topk_weights, out=None, **model):
    """out[t] = sum_k w[t, k] * expert_out[row_of[t, k]]; `model` (experts, pad, expert_begin,
    expert_end) finds the tuned kernel; see cutetune.ops.moe_combine.moe_combine."""
    from cutetune.ops.moe_combine import moe_combine as _moe_combine

    return _moe_combine(expert_out, row_of, topk_weights, out=out, **model)


__all__ = ["__version__", "current_dispatcher", "fused_add_rmsnorm", "gelu_and_mul", "moe_combine",
           "moe_dispatch", "qk_norm", "rmsnorm", "silu_and_mul", "warmup"]
