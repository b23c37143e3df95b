"""The machine code ptxas emits for the norms: every global load a thread makes is issued before
the reduction's first shuffle, so a call waits for one memory round trip, not two.

ptxas moves a load whose value is needed only after the reduction (the weight; qk_norm_rope's cos
and sin; qk_norm_rope_kv's slot, v and scales) down to its use; the kernels tie those loads
before the reduction, and this checks the SASS (cuobjdump and nvdisasm come from NVIDIA's pip
wheels, a test dependency).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from cutetune.kernels import qk_norm as qk
from cutetune.kernels import qk_norm_rope as qkr
from cutetune.kernels import qk_norm_rope_kv as qkr_kv
from cutetune.kernels import rmsnorm as rms
from cutetune.kernels.device import qk_norm as qk_device
from cutetune.kernels.device import qk_norm_rope as qkr_device
from cutetune.kernels.device import qk_norm_rope_kv as qkr_kv_device
from cutetune.kernels.device import rmsnorm as rms_device


def _cuda_bin() -> Path:
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations:
        for candidate in sorted(Path(root).glob("cu*/bin")):
            if (candidate / "cuobjdump").exists() and (candidate / "nvdisasm").exists():
                return candidate
    raise FileNotFoundError("cuobjdump and nvdisasm not found: install the test extras")


def sass(kernel_module, problem, config, tmp_path: Path) -> list[str]:
    kernel_module.compile_kernel(problem, config, options=f"--keep-cubin --dump-dir {tmp_path}")
    (cubin,) = tmp_path.glob("*.cubin")
    tools = _cuda_bin()
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    listing = subprocess.run([str(tools / "cuobjdump"), "--dump-sass", str(cubin)], env=env,
                             capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].strip() for line in listing.splitlines()
            if line.strip().startswith("/*") and "*/" in line]


QWEN3_8B_QK = qk.QKNormProblem(num_tokens=1, dtype="bfloat16", head_dim=128, q_heads=32,
                               kv_heads=8, eps=1e-6, weight_bias=0.0)


def qwen3_8b_qk_rope(cache_dtype: str) -> qkr.QKNormRopeProblem:
    return qkr.QKNormRopeProblem(num_tokens=1, dtype="bfloat16", head_dim=128, rotary_dim=128,
                                 q_heads=32, kv_heads=8, style="neox", positions_dtype="int64",
                                 cache_dtype=cache_dtype, theta=1e6, eps=1e-6, weight_bias=0.0)


def qwen3_8b_qk_rope_kv(kv_cache_dtype: str) -> qkr_kv.QKNormRopeKVProblem:
    return qkr_kv.QKNormRopeKVProblem(**qwen3_8b_qk_rope("bfloat16").static_fields(),
                                      num_tokens=1, kv_cache_dtype=kv_cache_dtype,
                                      block_size=16)


def rows(hidden: int, fused_add: bool) -> rms.RMSNormProblem:
    return rms.RMSNormProblem(num_tokens=1, dtype="bfloat16", out_dtype="bfloat16",
                              hidden=hidden, eps=1e-6, weight_bias=0.0, fused_add=fused_add)


@pytest.mark.parametrize(("module", "problem", "config"), [
    (qk_device, QWEN3_8B_QK, qk.QKNormConfig(64, 1, 8)),
    (qk_device, QWEN3_8B_QK, qk.QKNormConfig(128, 2, 4)),
    (rms_device, rows(4096, False), rms.RMSNormConfig("block_per_row", 128, 8)),
    (rms_device, rows(4096, True), rms.RMSNormConfig("block_per_row", 64, 4)),
    (rms_device, rows(1024, False), rms.RMSNormConfig("warp_per_row", 128, 4)),
    # The cos and sin rows too (two loads each from an fp32 cache).
    (qkr_device, qwen3_8b_qk_rope("bfloat16"), qkr.QKNormRopeConfig("cache", 128, 4, 1)),
    (qkr_device, qwen3_8b_qk_rope("float32"), qkr.QKNormRopeConfig("cache", 64, 2, 4)),
    # The slot, v's head and (FP8) the scales too.
    (qkr_kv_device, qwen3_8b_qk_rope_kv("bfloat16"), qkr.QKNormRopeConfig("cache", 128, 4, 1)),
    (qkr_kv_device, qwen3_8b_qk_rope_kv(qkr_kv.FP8), qkr.QKNormRopeConfig("cache", 64, 2, 4)),
], ids=["qk-64b-1hpw", "qk-128b-2hpw", "rms-block", "rms-block-fused", "rms-warp",
        "qk-rope-cache", "qk-rope-fp32-cache", "qk-rope-kv-bf16", "qk-rope-kv-fp8"])
def test_every_load_is_issued_before_the_first_shuffle(module, problem, config, tmp_path):
    code = sass(module, problem, config, tmp_path)
    assert any(op.startswith("LDG") for op in code) and any(op.startswith("SHFL") for op in code)
    # The kernel may hold one copy of the body per branch (q and k), each ending in an
    # unpredicated EXIT; within each, no load may follow a shuffle.
    late, shuffled = [], False
    for op in code:
        if op.startswith("SHFL"):
            shuffled = True
        elif op.startswith("LDG") and shuffled:
            late.append(op)
        elif op.startswith("EXIT"):
            shuffled = False
    assert not late, f"loads issued after the reduction began: {late}"
