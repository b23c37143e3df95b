"""The CI compile checks of qk_norm_rope_kv: the covering points of its space (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU for qwen3-8b's
problems (a cache of q's dtype and an FP8 e4m3 one), and the PTX shows the cache write: one
slot load per head, the cache stores at the configured width beside qk_norm_rope's, and FP8's
product by the scale's reciprocal and saturating cvt. The norm and rotation's other code paths
(partial rotary, GPT-J, scalings, dtypes) are qk_norm_rope's, compiled by its checks.

The `sweep` marker compiles every valid point of every preset's problems."""

import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.qk_norm_rope import QKNormRopeConfig
from cutetune.kernels.qk_norm_rope_kv import FP8, KERNEL, QKNormRopeKVProblem
from cutetune.kernels.rope import CACHE, COMPUTED, GPTJ, LINEAR, NEOX
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

H200 = DEVICE_SPECS["H200"]
BITS, HEADS_PER_WARP = 128, 4
PRESET_PARAMS = preset_params(KERNEL)
# The cache write's code paths are those of the cache's dtype and of the knobs; the presets'
# head counts only size the grid, and their norm and rotation are qk_norm_rope's to compile.
# One preset's problems (a cache of q's dtype and an FP8 one) take every path at CI's cost.
COVERED = [p for p in PRESET_PARAMS if p.id.startswith("qwen3-8b")]


def test_presets_cover_the_models_with_qk_norm_and_both_caches():
    # Guards the compiles against silently shrinking (a preset losing its problems).
    assert presets_of(KERNEL) == {name for name in PRESETS if name.startswith("qwen3")}
    assert {p.values[0].kv_cache_dtype for p in COVERED} == {"bfloat16", FP8}


@pytest.mark.parametrize("problem", COVERED)
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PRESET_PARAMS)
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


@pytest.mark.parametrize("cache", ("bfloat16", FP8))
def test_ptx_writes_the_cache(cache, tmp_path, monkeypatch):
    problem = QKNormRopeKVProblem(
        num_tokens=1, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=8, kv_heads=2,
        style=NEOX, positions_dtype="int64", cache_dtype="bfloat16", theta=1e4, eps=1e-6,
        weight_bias=0.0, kv_cache_dtype=cache, block_size=16)
    ptx = ptx_of(KERNEL, problem, QKNormRopeConfig(CACHE, BITS, HEADS_PER_WARP, 4), H200,
                 tmp_path, monkeypatch)
    accesses = Counter((op, int(lanes or 1) * int(width))
                       for op, lanes, width in GLOBAL_ACCESS.findall(ptx))
    vectors = 128 * 16 // BITS // (32 // HEADS_PER_WARP)  # of the head, per thread
    cache_bits = BITS // 2 if cache == FP8 else BITS
    # q's and k's vectors stored in place; k's and v's into the caches.
    assert accesses[("st", BITS)] == 2 * vectors + (0 if cache == FP8 else 2 * vectors)
    if cache == FP8:
        assert accesses[("st", cache_bits)] == 2 * vectors
        # Each element times its scale's reciprocal, rounded to e4m3 in pairs, saturating; the
        # two scales loaded and inverted once each (no division an element: it was the FP8
        # write's cost).
        assert len(re.findall(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b", ptx)) == vectors * 8
        assert len(re.findall(r"\brcp\.rn\.f32\b", ptx)) == 2
        assert not re.search(r"\bdiv\.(rn|full|approx)\.f32\b", ptx)
        assert accesses[("ld", 32)] == 2
    else:
        assert "e4m3" not in ptx and not re.search(r"\b(div|rcp)\.rn\.f32\b", ptx)
        assert accesses[("ld", 32)] == 0
    # The slot (int64) and the position (int64) of the k branch, the q branch's position.
    assert accesses[("ld", 64)] == 3


def test_narrow_vectors_of_a_partial_gptj_computed_fp16_head_compile_into_fp8():
    # 32-bit vectors of fp16 are 16-bit FP8 stores; the computed cos and sin, GPT-J pairs,
    # a rotated part of a quarter of a 256-wide head and zero-centred weights reach the cache.
    problem = QKNormRopeKVProblem(
        num_tokens=1, dtype="float16", head_dim=256, rotary_dim=64, q_heads=8, kv_heads=2,
        style=GPTJ, positions_dtype="int32", cache_dtype="float16", theta=1e4, eps=1e-6,
        weight_bias=1.0, kv_cache_dtype=FP8, block_size=32)
    assert_points_compile(KERNEL, problem, [QKNormRopeConfig(COMPUTED, 32, 1, 2)])


def test_gemma_3s_linearly_scaled_layers_compile_computed_into_the_cache():
    # Gemma 3 27B's full-attention layers: theta 1e6 scaled linearly by 8, zero-centred
    # weights, cos and sin computed.
    problem = QKNormRopeKVProblem(
        num_tokens=1, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=32, kv_heads=16,
        style=NEOX, positions_dtype="int64", cache_dtype="bfloat16", theta=1e6, eps=1e-6,
        weight_bias=1.0, scaling=LINEAR, scaling_factor=8.0, kv_cache_dtype="bfloat16",
        block_size=16)
    assert_points_compile(KERNEL, problem, [QKNormRopeConfig(COMPUTED, 128, 4, 4)])
