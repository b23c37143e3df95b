"""cutetune: autotuning and specialisation of CuTeDSL inference kernels.

    import cutetune
    cutetune.warmup("qwen3-8b")              # load this GPU's tuned winners, compile them
    cutetune.qk_norm(q, k, q_weight, k_weight, eps=1e-6)
    out, residual = cutetune.fused_add_rmsnorm(x, residual, weight, eps=1e-6)
    h = cutetune.silu_and_mul(gate_up)

The ops (cutetune.ops) import their kernel module (and CuTeDSL) on first use, and warmup the
dispatcher's modules.
"""

import importlib

from cutetune.version import __version__

# The public ops (and moe_dispatch's output buffers), warmup, and the modules that define them.
# Each is imported on first use (an op imports its kernel module, and CuTeDSL with it), then bound
# here, so a call costs no more than calling the op's own function. The dispatcher's modules are
# most of what `import cutetune` would cost otherwise, which `cutetune --help` must not pay.
_OPS = {
    "warmup": "cutetune.dispatch",
    "current_dispatcher": "cutetune.dispatch",
    "qk_norm": "cutetune.ops.qk_norm",
    "rmsnorm": "cutetune.ops.rmsnorm",
    "fused_add_rmsnorm": "cutetune.ops.rmsnorm",
    "silu_and_mul": "cutetune.ops.activation",
    "gelu_and_mul": "cutetune.ops.activation",
    "moe_dispatch": "cutetune.ops.moe_dispatch",
    "moe_dispatch_buffers": "cutetune.ops.moe_dispatch",
    "moe_combine": "cutetune.ops.moe_combine",
}


def __getattr__(name: str):
    module = _OPS.get(name)
    if module is None:
        raise AttributeError(f"module 'cutetune' has no attribute {name!r}")
    op = getattr(importlib.import_module(module), name)
    globals()[name] = op
    return op


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["__version__", *_OPS]
