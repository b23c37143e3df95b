"""cutetune: autotuning and specialisation of CuTeDSL inference kernels.

    import cutetune
    cutetune.warmup("qwen3-8b")              # load this GPU's tuned winners, compile them
    cutetune.qk_norm(q, k, q_weight, k_weight, eps=1e-6)
"""

from cutetune.dispatch import current_dispatcher, warmup


def qk_norm(q, k, q_weight, k_weight, eps: float = 1e-6, weight_bias: float = 0.0):
    """Per-head RMSNorm of q and k in place; see cutetune.kernels.qk_norm.qk_norm."""
    from cutetune.kernels.qk_norm import qk_norm as _qk_norm

    return _qk_norm(q, k, q_weight, k_weight, eps=eps, weight_bias=weight_bias)


__all__ = ["current_dispatcher", "qk_norm", "warmup"]
