"""The CI compile checks of the FP8 group-quant kernels: the covering points (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU for DeepSeek-V3's
problems and synthetic ones that add fp16, groups of 64, row-major and UE8M0 scales and the norm's
plain and warp-per-row forms; the PTX shows one product by the scale's reciprocal and one e4m3
conversion per element, NaN-quiet maxes, the shuffles of a group's lanes, the configured access
widths and the UE8M0 rounding; each kernel compiles for sm_100a too (in a child process: CuTeDSL
reads its target once). The `sweep` marker compiles every valid point."""

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.fp8_group_quant import (
    QUANT_KERNEL,
    SILU_QUANT_KERNEL,
    FP8GroupQuantProblem,
    GroupQuantConfig,
    SiluAndMulFP8QuantProblem,
)
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW, RMSNormConfig
from cutetune.kernels.rmsnorm_fp8_quant import KERNEL as NORM_KERNEL
from cutetune.kernels.rmsnorm_fp8_quant import RMSNormFP8QuantProblem
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.child_process import child_env
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, ptx_of
from testkit.covering_points import WHICH_POINTS, covering_configs

H200 = DEVICE_SPECS["H200"]
DEEPSEEK = PRESETS["deepseek-v3"]


def _quant(hidden, dtype="bfloat16", group=128, column_major=True, ue8m0=False):
    return FP8GroupQuantProblem(num_tokens=1, dtype=dtype, hidden=hidden, group_size=group,
                                column_major_scales=column_major, ue8m0=ue8m0)


def _silu(intermediate, dtype="bfloat16", group=128, column_major=True, ue8m0=False):
    return SiluAndMulFP8QuantProblem(num_tokens=1, dtype=dtype, intermediate=intermediate,
                                     group_size=group, column_major_scales=column_major,
                                     ue8m0=ue8m0)


def _norm(hidden, fused_add=True, dtype="bfloat16", group=128, column_major=True, ue8m0=False,
          weight_bias=0.0):
    return RMSNormFP8QuantProblem(num_tokens=1, dtype=dtype, hidden=hidden, eps=1e-6,
                                  weight_bias=weight_bias, fused_add=fused_add, group_size=group,
                                  column_major_scales=column_major, ue8m0=ue8m0)


PROBLEMS = [
    # DeepSeek-V3's: hidden 7168 (56 groups; the norm's rows are ragged over 8 warps) and the
    # expert width 2048, column-major fp32 scales.
    pytest.param(QUANT_KERNEL, QUANT_KERNEL.problems_for_model(DEEPSEEK, "bfloat16")[0],
                 id="quant-deepseek-7168"),
    pytest.param(SILU_QUANT_KERNEL, SILU_QUANT_KERNEL.problems_for_model(DEEPSEEK,
                                                                         "bfloat16")[1],
                 id="silu-deepseek-2048"),
    pytest.param(NORM_KERNEL, NORM_KERNEL.problems_for_model(DEEPSEEK, "bfloat16")[1],
                 id="norm-fused-deepseek-7168"),
    pytest.param(NORM_KERNEL, NORM_KERNEL.problems_for_model(DEEPSEEK, "bfloat16")[3],
                 id="norm-plain-deepseek-512"),
    # fp16, groups of 64, row-major UE8M0 scales; Gemma-style weights.
    pytest.param(QUANT_KERNEL, _quant(4096, "float16", 64, False, True), id="quant-fp16-g64"),
    pytest.param(SILU_QUANT_KERNEL, _silu(1536, "float16", 64, False, True),
                 id="silu-fp16-g64"),
    pytest.param(NORM_KERNEL, _norm(2048, False, "float16", 64, False, True, 1.0),
                 id="norm-plain-fp16-g64"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("kernel, problem", PROBLEMS)
def test_points_compile(kernel, problem, which):
    # The covering points start from the defaults served at every bucket, so the pairs those
    # cover need no other point.
    points = (kernel.space.enumerate(problem, H200).valid if which == "every"
              else covering_configs(kernel, problem, H200, BUCKETS))
    assert_points_compile(kernel, problem, points)


def _instructions(ptx: str) -> Counter:
    return Counter(re.findall(r"\b(cvt\.rn\.satfinite\.e4m3x2\.f32|div\.rn\.f32|rcp\.rn\.f32"
                              r"|max\.NaN\.f32|max\.f32|shfl\.sync\.bfly\.b32)\b", ptx))


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("config", [GroupQuantConfig(128, 8, 2, 4, "normal"),
                                    GroupQuantConfig(64, 4, 1, 1, "streaming"),
                                    GroupQuantConfig(32, 32, 1, 2, "normal")],
                         ids=lambda c: f"{c.vector_bits}b-{c.lanes_per_group}lanes")
def test_ptx_of_the_group_kernel(config, ue8m0, tmp_path, monkeypatch):
    problem = _quant(7168, ue8m0=ue8m0)
    ptx = ptx_of(QUANT_KERNEL, problem, config, H200, tmp_path, monkeypatch)
    per_thread = config.groups_per_thread * 128 // config.lanes_per_group  # elements
    shuffles = config.lanes_per_group.bit_length() - 1
    found = _instructions(ptx)
    # Each group's scale divided and inverted once, each element multiplied by the inverse
    # (no division an element) and converted in pairs.
    assert found["div.rn.f32"] == found["rcp.rn.f32"] == config.groups_per_thread
    assert found["cvt.rn.satfinite.e4m3x2.f32"] == per_thread // 2
    assert found["shfl.sync.bfly.b32"] == shuffles * config.groups_per_thread
    # NaN-quiet maxes: per element, per shuffle and the floor's.
    assert found["max.NaN.f32"] == 0
    assert found["max.f32"] == per_thread + (shuffles + 1) * config.groups_per_thread
    accesses = Counter((op, int(lanes or 1) * int(width))
                       for op, lanes, width in GLOBAL_ACCESS.findall(ptx))
    loads = per_thread * 16 // config.vector_bits
    assert accesses[("ld", config.vector_bits)] == loads
    # FP8 stores half as wide as the bf16 loads (one byte an element), and a 32-bit store of
    # each group's scale.
    scales = config.groups_per_thread
    assert accesses[("st", config.vector_bits // 2)] == loads + (
        scales if config.vector_bits // 2 == 32 else 0)
    assert accesses[("st", 32)] == scales + (loads if config.vector_bits // 2 == 32 else 0)
    streaming = config.cache_hints == "streaming"
    assert ("ld.global.cs" in ptx) == streaming and ("st.global.cs" in ptx) == streaming
    # UE8M0's rounding up: an add of the mantissa's ones and a mask of the exponent's bits.
    assert ("8388607" in ptx and "2139095040" in ptx) == ue8m0


def test_ptx_of_the_fused_silu_and_norm(tmp_path, monkeypatch):
    silu = _silu(2048)
    ptx = ptx_of(SILU_QUANT_KERNEL, silu, GroupQuantConfig(128, 8, 1, 4), H200,
                 tmp_path, monkeypatch)
    found = _instructions(ptx)
    assert found["div.rn.f32"] == found["rcp.rn.f32"] == 1
    assert found["cvt.rn.satfinite.e4m3x2.f32"] == 8
    assert "ex2.approx" in ptx  # silu's sigmoid, device/activation.py's
    norm = _norm(7168)
    (tmp_path / "norm").mkdir()
    ptx = ptx_of(NORM_KERNEL, norm, RMSNormConfig(BLOCK_PER_ROW, 128, 8), H200,
                 tmp_path / "norm", monkeypatch)
    found = _instructions(ptx)
    # 896 vectors over 256 threads: 4 slots (the last ragged), 8 elements each, one group
    # (16 lanes, 4 shuffles) per slot.
    assert found["div.rn.f32"] == found["rcp.rn.f32"] == 4
    assert found["cvt.rn.satfinite.e4m3x2.f32"] == 4 * 4
    assert found["max.NaN.f32"] == 0
    assert found["shfl.sync.bfly.b32"] >= 4 * 4


def test_warp_per_row_norm_compiles_groups_of_a_warp():
    problem = _norm(1024, fused_add=True, group=64)
    assert_points_compile(NORM_KERNEL, problem, [RMSNormConfig(WARP_PER_ROW, 64, 8),
                                                 RMSNormConfig(WARP_PER_ROW, 32, 1)])


SM100_SCRIPT = """
import json, sys
from cutetune.kernels.registry import get_kernel
from cutetune.device.specs import DEVICE_SPECS
spec = DEVICE_SPECS["B200"]
for name, static in json.loads(sys.argv[1]):
    kernel = get_kernel(name)
    problem = kernel.problem_type.from_static_key(static, 1)
    for tokens in (1, 32768):
        config = kernel.default_config(problem.with_tokens(tokens), spec)
        assert callable(kernel.compile(problem, config)), name
print("ok")
"""


def test_each_kernel_compiles_for_sm_100a():
    cases = [(kernel.name, problem.static_key()) for kernel, problem in (
        (QUANT_KERNEL, _quant(7168, ue8m0=True)), (SILU_QUANT_KERNEL, _silu(2048)),
        (NORM_KERNEL, _norm(7168)))]
    done = subprocess.run([sys.executable, "-c", SM100_SCRIPT, json.dumps(cases)],
                          env=child_env(CUTE_DSL_ARCH="sm_100a"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
