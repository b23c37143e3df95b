"""The names of the kernels cutetune registers, readable without importing any kernel.

The registry (registry.py) knows the kernels only once it has imported every kernel module, and
with them torch and CuTeDSL: seconds that `cutetune --help`, which lists the kernels, must not
spend. tests/kernels/test_registry.py fails when this list and the names the kernel modules
register differ, so a kernel added, renamed or removed without this list is caught.
"""

from __future__ import annotations

KERNEL_NAMES: tuple[str, ...] = (
    "embedding",
    "embedding_rmsnorm",
    "fp8_group_quant",
    "gelu_and_mul",
    "moe_combine",
    "moe_dispatch",
    "moe_dispatch_fp8_quant",
    "mxfp8_quant",
    "nvfp4_quant",
    "qk_norm",
    "qk_norm_rope",
    "qk_norm_rope_kv",
    "rmsnorm",
    "rmsnorm_fp8_quant",
    "rope",
    "silu_and_mul",
    "silu_and_mul_fp8_quant",
)
