"""The CI compile checks: the covering points of the rope space (every pair of knob values, and
the defaults served at every bucket) compile for sm_90a on the CPU, for every public preset the
kernel applies to (bf16) and for synthetic problems that take every other code path: GPT-J
style, partial rotary, int32 positions, an fp32 cache, fp16 and fp32, head dims 64 and 256; and
the PTX of a few points shows the accesses and the arithmetic the config asks for. The Llama
3.1 presets compile the llama3 frequency scaling; synthetic problems the yarn and linear ones
and both layouts of multimodal RoPE.

The `sweep` marker compiles every valid point.
"""

import dataclasses
import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.rope import (
    CACHE,
    COMPUTED,
    DEFAULT,
    GPTJ,
    KERNEL,
    LINEAR,
    MROPE_INTERLEAVED,
    MROPE_SECTIONS,
    NEOX,
    SCALED_FIELDS,
    YARN,
    RopeConfig,
    RopeProblem,
    yarn_attention_factor,
)
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


def _problem(dtype="bfloat16", head_dim=128, rotary_dim=128, style=NEOX, positions="int64",
             cache=None, theta=1e4, kv_heads=2, **scaling):
    return RopeProblem(num_tokens=1, dtype=dtype, head_dim=head_dim, rotary_dim=rotary_dim,
                       q_heads=8, kv_heads=kv_heads, style=style, positions_dtype=positions,
                       cache_dtype=cache or dtype, theta=theta, **scaling)


# Qwen3's long-context YaRN; gpt-oss's (its ramp's ends not rounded).
QWEN3_YARN = dict(scaling=YARN, scaling_factor=4.0, original_max_position=32768,
                  attention_factor=yarn_attention_factor(4.0))
GPT_OSS_YARN = dict(scaling=YARN, scaling_factor=32.0, original_max_position=4096,
                    truncate=False, attention_factor=yarn_attention_factor(32.0))


# Gemma 3 4B to 27B's full-attention layers' linear scaling.
GEMMA3_LINEAR = dict(scaling=LINEAR, scaling_factor=8.0)


SYNTHETIC = [
    pytest.param(_problem(style=GPTJ), id="gptj"),
    pytest.param(_problem(rotary_dim=64, positions="int32"), id="neox-partial-int32"),
    pytest.param(_problem(style=GPTJ, rotary_dim=32, cache="float32"), id="gptj-partial-fp32cache"),
    pytest.param(_problem(dtype="float16", head_dim=64, rotary_dim=64), id="fp16-d64"),
    pytest.param(_problem(dtype="float32", head_dim=256, rotary_dim=256, style=GPTJ,
                          positions="int32"), id="fp32-d256-gptj"),
    pytest.param(_problem(theta=1e6, **QWEN3_YARN), id="neox-yarn"),
    pytest.param(_problem(dtype="float32", head_dim=64, rotary_dim=32, style=GPTJ, theta=1.5e5,
                          **GPT_OSS_YARN), id="fp32-gptj-partial-yarn-untruncated"),
    # Gemma 3 27B's full-attention layers (its shape: 32 q heads of 128, 16 kv heads).
    pytest.param(dataclasses.replace(_problem(theta=1e6, kv_heads=16, **GEMMA3_LINEAR),
                                     q_heads=32), id="gemma-3-linear"),
    pytest.param(_problem(dtype="float16", style=GPTJ, rotary_dim=64, positions="int32",
                          **GEMMA3_LINEAR), id="fp16-gptj-partial-int32-linear"),
    # Qwen3-VL's interleaved mrope; Qwen2-VL's runs of pairs per stream, on GPT-J pairs.
    pytest.param(_problem(theta=5e6, mrope=MROPE_INTERLEAVED, mrope_t=24, mrope_h=20,
                          mrope_w=20), id="neox-mrope-interleaved"),
    pytest.param(_problem(style=GPTJ, positions="int32", mrope=MROPE_SECTIONS, mrope_t=16,
                          mrope_h=24, mrope_w=24), id="gptj-int32-mrope-sections"),
]
PRESET_PARAMS = preset_params(KERNEL)


def test_presets_cover_the_models_with_attention_heads():
    # Guards the compiles against silently shrinking (a preset losing its rope problem); the
    # Llama 3.1 presets take the llama3 scaling's code, DeepSeek-V3 MLA's (GPT-J pairs of one
    # shared k head, YaRN). A problem two presets share (Mixtral's is Qwen3-8B's) is one param.
    named = {name for name in PRESETS if name.startswith(("qwen3", "llama-3.1"))}
    assert presets_of(KERNEL) == named | {"mixtral-8x7b", "deepseek-v3"}


@pytest.mark.parametrize("problem", PRESET_PARAMS + SYNTHETIC)
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PRESET_PARAMS + SYNTHETIC)
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX

BRANCHES = 2  # q's heads in one branch, k's in the other

PTX_CASES = [
    # style, cos_sin, cache dtype, vector_bits, heads_per_thread
    (NEOX, CACHE, "bfloat16", 128, 1),
    (NEOX, CACHE, "float32", 128, 2),
    (NEOX, COMPUTED, "bfloat16", 128, 2),
    (NEOX, CACHE, "bfloat16", 64, 4),
    (GPTJ, CACHE, "bfloat16", 128, 1),
    (GPTJ, COMPUTED, "bfloat16", 64, 2),
    (GPTJ, CACHE, "float32", 32, 1),
]


@pytest.mark.parametrize(("style", "cos_sin", "cache", "bits", "heads"), PTX_CASES,
                         ids=[f"{s}-{c}-{d}-v{b}-h{h}" for s, c, d, b, h in PTX_CASES])
def test_ptx_accesses_and_angle_arithmetic(style, cos_sin, cache, bits, heads, tmp_path,
                                           monkeypatch):
    # kv_heads a multiple of every heads_per_thread here: the compiler drops the stores of a
    # head it can prove past the last (k's third and fourth of 2 heads).
    problem = _problem(style=style, cache=cache, kv_heads=4)
    ptx = ptx_of(KERNEL, problem, RopeConfig(cos_sin, bits, heads, 4), H200, tmp_path,
                 monkeypatch)
    accesses = Counter((op, int(lanes or 1) * int(width))
                       for op, lanes, width in GLOBAL_ACCESS.findall(ptx))
    halves = 2 if style == NEOX else 1
    # q and k: every load and store one vector of the configured width, both halves of a NeoX
    # chunk, each of the thread's heads, in each branch.
    assert accesses[("st", bits)] == BRANCHES * heads * halves
    assert sum(n for (op, _), n in accesses.items() if op == "st") == accesses[("st", bits)]
    x_loads = BRANCHES * heads * halves
    # One load of the position (64-bit).
    assert accesses[("ld", 64)] >= 1
    pairs = bits // 16 if style == NEOX else bits // 32
    cache_bits = pairs * (32 if cache == "float32" else 16)
    if cos_sin == CACHE:
        # A cos vector and a sin vector of the chunk's pairs, in accesses of at most 128 bits.
        pieces = 2 * max(1, cache_bits // 128)
        loads = sum(n for (op, _), n in accesses.items() if op == "ld")
        assert loads == x_loads + pieces + 1
        assert not re.search(r"\.f64\b", ptx)
    else:
        # No cache row read: the frequencies and angles are fp64 arithmetic.
        loads = sum(n for (op, _), n in accesses.items() if op == "ld")
        assert loads == x_loads + 1
        assert re.search(r"\bmul(\.rn)?\.f64\b", ptx)
        assert "cvt.rn.f32.f64" in ptx
        # Accurate sine and cosine: no fast-math approximation.
        assert "sin.approx" not in ptx and "cos.approx" not in ptx


def _unscaled(problem: RopeProblem) -> RopeProblem:
    return dataclasses.replace(problem, scaling=DEFAULT, **{
        f.name: f.default for f in dataclasses.fields(RopeProblem) if f.name in SCALED_FIELDS})


@pytest.mark.parametrize(("scaled", "products"), [
    pytest.param(KERNEL.problems_for_model(PRESETS["llama-3.1-8b"], "bfloat16")[0], 0,
                 id="llama3"),
    pytest.param(_problem(theta=1e6, kv_heads=8, **QWEN3_YARN), 2 * 8, id="yarn"),
])
def test_ptx_of_a_scaling_blends_in_fp64(scaled, products, tmp_path, monkeypatch):
    config = RopeConfig(COMPUTED, 128, 1, 4)
    counts = []
    for problem, name in ((scaled, "scaled"), (_unscaled(scaled), "plain")):
        (tmp_path / name).mkdir()
        ptx = ptx_of(KERNEL, problem, config, H200, tmp_path / name, monkeypatch)
        counts.append(Counter(selects=len(re.findall(r"\bselp\.f64\b", ptx)),
                              products=len(re.findall(r"\bmul(\.rn)?\.f32\b", ptx))))
    counts[0].subtract(counts[1])
    # Each of the chunk's 8 pairs clamps its blend weight to [0, 1]: two fp64 selects a pair
    # (computed once, before the q/k branch); YaRN multiplies its cos and sin by the attention
    # factor in fp32.
    assert counts[0] == Counter(selects=2 * 8, products=products)


def test_ptx_of_the_linear_scaling_is_a_product_per_pair(tmp_path, monkeypatch):
    """Linear scaling multiplies each pair's fp64 frequency by the factor's reciprocal: one
    fp64 product per pair more than theta's frequencies, no blend (no select)."""
    config = RopeConfig(COMPUTED, 128, 1, 4)
    scaled = _problem(theta=1e6, kv_heads=8, **GEMMA3_LINEAR)
    counts = []
    for problem, name in ((scaled, "scaled"), (_unscaled(scaled), "plain")):
        (tmp_path / name).mkdir()
        ptx = ptx_of(KERNEL, problem, config, H200, tmp_path / name, monkeypatch)
        counts.append(Counter(selects=len(re.findall(r"\bselp\.f64\b", ptx)),
                              products=len(re.findall(r"\bmul(\.rn)?\.f64\b", ptx))))
    counts[0].subtract(counts[1])
    assert counts[0] == Counter(selects=0, products=8)  # the chunk's 8 pairs


@pytest.mark.parametrize("cos_sin", (CACHE, COMPUTED))
def test_ptx_of_mrope_reads_three_positions_and_a_cache_row_of_each(cos_sin, tmp_path,
                                                                     monkeypatch):
    """A chunk's pairs may rotate by any of the three streams (interleaved, one in three): the
    cache path loads the chunk's cos and sin vectors from the row of each stream's position and
    picks per pair; the computed path takes each pair's angle from its stream's position."""
    problem = _problem(theta=5e6, kv_heads=4, mrope=MROPE_INTERLEAVED, mrope_t=24, mrope_h=20,
                       mrope_w=20)
    ptx = ptx_of(KERNEL, problem, RopeConfig(cos_sin, 128, 1, 4), H200, tmp_path, monkeypatch)
    loads = Counter((int(lanes or 1) * int(width))
                    for op, lanes, width in GLOBAL_ACCESS.findall(ptx) if op == "ld")
    x_loads = BRANCHES * 2  # both halves of the NeoX chunk of one head, in each branch
    positions = 3  # int64 each
    cache_vectors = 3 * 2 if cos_sin == CACHE else 0  # cos and sin, 8 bf16 pairs each
    assert loads[128] == x_loads + cache_vectors
    assert loads[64] == positions
    assert sum(loads.values()) == x_loads + cache_vectors + positions
