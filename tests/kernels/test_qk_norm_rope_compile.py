"""The CI compile checks: the covering points of the qk_norm_rope space (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU, for every public
preset the kernel applies to (bf16) and for synthetic problems that take every other code path:
Qwen3-Next's partial rotary and zero-centred weights, Gemma 3's head dim 256, GPT-J style,
int32 positions, an fp32 cache, fp16 and fp32, head dim 64, the llama3 frequency scaling and
the linear one (Gemma 3 4B to 27B's full-attention layers); and
the PTX of a few points shows the accesses the config asks for.

The `sweep` marker compiles every valid point.
"""

import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.qk_norm_rope import (
    KERNEL,
    QKNormRopeConfig,
    QKNormRopeProblem,
)
from cutetune.kernels.rope import CACHE, COMPUTED, GPTJ, LINEAR, LLAMA3, NEOX
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
             cache=None, weight_bias=0.0, kv_heads=2, **scaling):
    return QKNormRopeProblem(num_tokens=1, dtype=dtype, head_dim=head_dim,
                             rotary_dim=rotary_dim, q_heads=8, kv_heads=kv_heads, style=style,
                             positions_dtype=positions, cache_dtype=cache or dtype, theta=1e4,
                             eps=1e-6, weight_bias=weight_bias, **scaling)


SYNTHETIC = [
    pytest.param(_problem(head_dim=256, rotary_dim=64, weight_bias=1.0), id="qwen3-next"),
    pytest.param(_problem(dtype="float16", head_dim=256, rotary_dim=256, weight_bias=1.0,
                          positions="int32"), id="gemma-3-fp16-int32"),
    pytest.param(_problem(style=GPTJ, rotary_dim=64, cache="float32"),
                 id="gptj-partial-fp32cache"),
    pytest.param(_problem(dtype="float32", head_dim=64, rotary_dim=64, style=GPTJ),
                 id="fp32-d64-gptj"),
    pytest.param(_problem(scaling=LLAMA3, scaling_factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position=8192), id="llama3"),
    pytest.param(_problem(weight_bias=1.0, scaling=LINEAR, scaling_factor=8.0),
                 id="gemma-3-linear"),
]
PRESET_PARAMS = preset_params(KERNEL)


def test_presets_cover_the_models_with_qk_norm():
    # Guards the compiles against silently shrinking (a preset losing its problem).
    assert presets_of(KERNEL) == {name for name in PRESETS if name.startswith("qwen3")}


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
    # style, cos_sin, cache dtype, vector_bits, heads_per_warp
    (NEOX, CACHE, "bfloat16", 128, 4),
    (NEOX, CACHE, "float32", 64, 8),
    (NEOX, COMPUTED, "bfloat16", 128, 8),
    (GPTJ, CACHE, "bfloat16", 128, 2),
    (GPTJ, COMPUTED, "bfloat16", 64, 4),
]


@pytest.mark.parametrize(("style", "cos_sin", "cache", "bits", "heads_per_warp"), PTX_CASES,
                         ids=[f"{s}-{c}-{d}-v{b}-h{h}" for s, c, d, b, h in PTX_CASES])
def test_ptx_accesses(style, cos_sin, cache, bits, heads_per_warp, tmp_path, monkeypatch):
    problem = _problem(style=style, cache=cache)
    ptx = ptx_of(KERNEL, problem, QKNormRopeConfig(cos_sin, bits, heads_per_warp, 4), H200,
                 tmp_path, monkeypatch)
    accesses = Counter((op, int(lanes or 1) * int(width))
                       for op, lanes, width in GLOBAL_ACCESS.findall(ptx))
    vectors = 128 * 16 // bits // (32 // heads_per_warp)  # of the head, per thread
    rotated = vectors // 2 if style == NEOX else vectors  # rotary_dim is head_dim here
    # Every vector of the head stored once, at the configured width, in each branch.
    assert accesses[("st", bits)] == BRANCHES * vectors
    assert sum(n for (op, _), n in accesses.items() if op == "st") == accesses[("st", bits)]
    # The head's and the weight's vectors, and the position, in each branch.
    own = BRANCHES * (2 * vectors + 1)
    loads = sum(n for (op, _), n in accesses.items() if op == "ld")
    if cos_sin == CACHE:
        pairs = bits // 16 if style == NEOX else bits // 32
        cache_bits = pairs * (32 if cache == "float32" else 16)
        # A cos and a sin vector per rotated vector, in accesses of at most 128 bits.
        assert loads == own + BRANCHES * rotated * 2 * max(1, cache_bits // 128)
        assert not re.search(r"\.f64\b", ptx)
    else:
        assert loads == own
        assert re.search(r"\bmul(\.rn)?\.f64\b", ptx)
        assert "sin.approx" not in ptx and "cos.approx" not in ptx
    # The head's squared sum: log2(threads per head) butterfly shuffles in each branch.
    shuffles = len(re.findall(r"\bshfl\.sync\.bfly\b", ptx))
    assert shuffles == BRANCHES * (32 // heads_per_warp).bit_length() - BRANCHES
