"""The CI compile checks: the covering points of the qk_norm space (every pair of knob values, and
the defaults served at every bucket) compile for sm_90a on the CPU, for every public preset the
kernel applies to (in bf16, the dtype those models ship in) and for every other dtype and head
dim on a synthetic Gemma-style problem (weight_bias 1); and the PTX of a few points shows the
vector width and the shuffle tree the config asks for.

About 310 compiles at 0.3-1 s each (heads per warp x warps per block alone are 24-30 pairs a
problem); the `sweep` marker compiles every valid point (about 790).
"""

import math
import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.qk_norm import HEAD_DIMS, KERNEL, QKNormConfig, QKNormProblem
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import (
    GLOBAL_ACCESS,
    assert_points_compile,
    preset_params,
    presets_of,
    ptx_of,
)
from testkit.covering_points import covering_configs

DTYPES = ("bfloat16", "float16", "float32")
H200 = DEVICE_SPECS["H200"]


def _synthetic_params() -> list:
    return [
        pytest.param(
            QKNormProblem(num_tokens=1, dtype=dtype, head_dim=head_dim, q_heads=8, kv_heads=2,
                          eps=1e-6, weight_bias=1.0),
            id=f"d{head_dim}-{dtype}-bias1",
        )
        for head_dim in HEAD_DIMS
        for dtype in DTYPES
        if (dtype, head_dim) != ("bfloat16", 128)  # the presets compile that family
    ]


PRESET_PARAMS = preset_params(KERNEL)


def test_sweep_covers_every_qwen3_preset():
    # Guards the sweep against silently shrinking (e.g. a preset losing qk_norm); preset_params
    # gives each of their problems.
    assert presets_of(KERNEL) == {name for name in PRESETS if name.startswith("qwen3")}


@pytest.mark.parametrize("problem", PRESET_PARAMS + _synthetic_params())
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PRESET_PARAMS + _synthetic_params())
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX

BRANCHES = 2  # the kernel normalises q in one branch and k in the other




PTX_CASES = [
    # dtype, vector_bits, heads_per_warp, warps_per_block
    ("bfloat16", 128, 2, 4),
    ("bfloat16", 128, 16, 8),
    ("bfloat16", 64, 1, 4),
    ("bfloat16", 32, 1, 1),
    ("float32", 128, 1, 4),
    ("float32", 64, 1, 4),
    ("float32", 32, 1, 2),
    ("float32", 128, 4, 2),
]


@pytest.mark.parametrize(("dtype", "vector_bits", "heads_per_warp", "warps"), PTX_CASES,
                         ids=[f"{d}-v{v}-hpw{h}-w{w}" for d, v, h, w in PTX_CASES])
def test_ptx_vector_width_and_shuffle_tree(dtype, vector_bits, heads_per_warp, warps, tmp_path,
                                           monkeypatch):
    problem = QKNormProblem(num_tokens=1, dtype=dtype, head_dim=128, q_heads=32, kv_heads=8,
                            eps=1e-6, weight_bias=0.0)
    config = QKNormConfig(vector_bits, heads_per_warp, warps)
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)

    accesses = GLOBAL_ACCESS.findall(ptx)
    assert len(accesses) == ptx.count("ld.global") + ptx.count("st.global") > 0
    widths = Counter((op, int(lanes or 1) * int(bits)) for op, lanes, bits in accesses)
    # Every global load and store is exactly one vector of the configured width: nothing
    # split into narrower accesses, nothing wider than the config allows.
    assert set(widths) == {("ld", vector_bits), ("st", vector_bits)}, widths

    threads_per_head = 32 // heads_per_warp
    element_bits = 16 if dtype == "bfloat16" else 32
    vectors_per_thread = 128 // threads_per_head // (vector_bits // element_bits)
    # Per branch and vector: one load of x and one of the weight, one store of y.
    assert widths[("ld", vector_bits)] == BRANCHES * 2 * vectors_per_thread
    assert widths[("st", vector_bits)] == BRANCHES * vectors_per_thread

    if vector_bits == 128:
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx
    else:
        # No 128-bit access anywhere (v4 of 32-bit lanes or v2 of 64-bit lanes).
        assert not re.search(r"(ld|st)\.global(\.\w+)*\.(v4\.[bfsu]32|v2\.[bfsu]64)", ptx)

    # The squared sum is reduced by log2(threads per head) butterfly shuffles in each branch.
    shuffles = re.findall(r"\bshfl\.sync\.bfly\.b32\b", ptx)
    assert len(shuffles) == BRANCHES * int(math.log2(threads_per_head))
    offsets = sorted(int(m) for m in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),",
                                                ptx))
    expected = sorted(BRANCHES * [threads_per_head >> (i + 1)
                                  for i in range(int(math.log2(threads_per_head)))])
    assert offsets == expected


def test_ptx_bfloat16_64_bit_accesses_are_four_halves_or_two_words(tmp_path, monkeypatch):
    # 64-bit bf16 vectors: loads come out as ld.global.v4.b16 and stores as st.global.v2.b32
    # (both 64 bits); no load or store is a 128-bit v4 of 32-bit lanes.
    problem = QKNormProblem(num_tokens=1, dtype="bfloat16", head_dim=128, q_heads=32,
                            kv_heads=8, eps=1e-6, weight_bias=0.0)
    ptx = ptx_of(KERNEL, problem, QKNormConfig(64, 1, 4), H200, tmp_path, monkeypatch)
    assert re.search(r"ld\.global\.(v4\.b16|v2\.b32)\b", ptx)
    assert re.search(r"st\.global\.(v4\.b16|v2\.b32)\b", ptx)
    assert not re.search(r"(ld|st)\.global\.v4\.b32\b", ptx)
