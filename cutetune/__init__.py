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

from cutetune.version import __version__ as __version__

# warmup and current_dispatcher, and the public ops (cutetune.ops' registry: importing it imports
# every op, with torch and their kernels' declarations), are each bound here on first use, so a
# call costs no more than calling the function itself. The dispatcher's modules are most of what
# `import cutetune` would cost otherwise, which `cutetune --help` must not pay.
_DISPATCH = ("warmup", "current_dispatcher")


def __getattr__(name: str):
    if name == "__all__":
        return ["__version__", *_DISPATCH, *_public_ops()]
    if name in _DISPATCH:
        value = getattr(importlib.import_module("cutetune.serving.warmup"), name)
    elif name.startswith("_") or _is_submodule(name):  # no op: asking imports nothing
        raise AttributeError(f"module 'cutetune' has no attribute {name!r}")
    else:
        value = _public_ops().get(name)
        if value is None:
            raise AttributeError(f"module 'cutetune' has no attribute {name!r}")
    globals()[name] = value
    return value


def _is_submodule(name: str) -> bool:
    """Whether `name` is a module of the package (`from cutetune import cli` asks the package
    before importing it)."""
    import pkgutil

    return any(module.name == name for module in pkgutil.iter_modules(__path__))


def _public_ops() -> dict:
    return importlib.import_module("cutetune.ops.registry").public_functions()


def __dir__() -> list[str]:
    return sorted(__getattr__("__all__"))
