"""qk_norm_rope's Problem, Config space, seed heuristic, cost, reference and model problems (no
compiling)."""

import math
from pathlib import Path

import pytest
import torch

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels import qk_norm, rope
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.qk_norm_rope import (
    KERNEL,
    SPACE,
    QKNormRopeConfig,
    QKNormRopeProblem,
    cost,
    default_config,
    make_inputs,
    problems_for_model,
    reference,
)
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.kernels.rope import CACHE, COMPUTED, DEFAULT, GPTJ, LINEAR, LLAMA3, NEOX
from cutetune.spaces.models import PRESETS, load_model
from cutetune.spaces.space import EmptySpaceError

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def problem(**overrides) -> QKNormRopeProblem:
    values = dict(num_tokens=1, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=32,
                  kv_heads=8, style=NEOX, positions_dtype="int64", cache_dtype="bfloat16",
                  theta=1e6, eps=1e-6, weight_bias=0.0)
    values.update(overrides)
    return QKNormRopeProblem(**values)


def test_registered_under_its_name():
    assert get_kernel("qk_norm_rope") is KERNEL
    assert KERNEL.space is SPACE
    assert KERNEL.problem_type is QKNormRopeProblem


@pytest.mark.parametrize(("field", "value", "message"), [
    # rope's checks
    ("rotary_dim", 130, "rotary_dim 130 must be even and in"),
    ("style", "llama", "style 'llama' not supported"),
    ("theta", 1.0, "theta must be a finite number above 1"),
    ("scaling", "yarn", "yarn scaling needs scaling_factor >= 1"),
    # qk_norm's checks
    ("head_dim", 96, "head_dim 96 not supported"),
    ("eps", 0.0, "eps must be positive"),
    ("weight_bias", 0.5, "weight_bias must be 0 or 1"),
])
def test_problem_validation_is_rope_s_and_qk_norm_s(field, value, message):
    values = {field: value, **({"rotary_dim": 64} if field == "head_dim" else {})}
    with pytest.raises(ValueError, match=message):
        problem(**values)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(scaling="yarn", scaling_factor=4.0, original_max_position=32768),
     "scaling 'yarn' not supported by qk_norm_rope"),
    (dict(mrope="interleaved", mrope_t=24, mrope_h=20, mrope_w=20),
     "mrope 'interleaved' not supported by qk_norm_rope"),
])
def test_a_rotation_rope_computes_and_this_kernel_not_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        problem(**fields)


def test_problem_key_holds_rope_s_fields_then_the_norm_s():
    assert problem(num_tokens=1).static_key() == problem(num_tokens=4096).static_key()
    assert problem().static_tuple() == ("bfloat16", 128, 128, 32, 8, NEOX, "int64", "bfloat16",
                                        1e6, "default", 1.0, 1.0, 1.0, 0, 32.0, 1.0, True, 1.0,
                                        "none", 0, 0, 0, 1e-6, 0.0)
    assert problem().norm == qk_norm.QKNormProblem(num_tokens=1, dtype="bfloat16",
                                                   head_dim=128, q_heads=32, kv_heads=8,
                                                   eps=1e-6, weight_bias=0.0)


# ---------------------------------------------------------------------------------------------
# Model problems


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("qwen3")])
def test_qwen3_presets_normalise_then_rotate(name):
    model = PRESETS[name]
    (p,) = problems_for_model(model, "bfloat16")
    assert p == problem(q_heads=model.num_q_heads, kv_heads=model.num_kv_heads,
                        theta=model.ropes[0].theta, eps=model.rms_norm_eps)


def test_qwen3_next_rotates_a_quarter_of_a_zero_centred_norm():
    (p,) = problems_for_model(load_model(str(HF_CONFIGS / "Qwen3-Next-80B-A3B-Instruct.json")),
                              "bfloat16")
    assert (p.head_dim, p.rotary_dim, p.weight_bias, p.q_heads, p.kv_heads) == (
        256, 64, 1.0, 16, 2)
    assert SPACE.enumerate(p, H200).valid


def test_gemma_3_has_a_problem_per_theta():
    problems = problems_for_model(load_model(str(HF_CONFIGS / "gemma-3-1b-it.json")), "float16")
    assert [(p.theta, p.scaling) for p in problems] == [(1e4, DEFAULT), (1e6, DEFAULT)]
    assert {(p.head_dim, p.rotary_dim, p.weight_bias, p.cache_dtype) for p in problems} == {
        (256, 256, 1.0, "float16")}


def test_gemma_3_27b_has_its_sliding_and_its_linearly_scaled_rotation():
    """Gemma 3 4B to 27B: the sliding-window layers rotate by rope_local_base_freq unscaled,
    the full-attention ones by rope_theta scaled linearly (the configs state neither theta:
    the config class's defaults)."""
    problems = problems_for_model(load_model(str(HF_CONFIGS / "gemma-3-27b-it.json")),
                                  "bfloat16")
    assert [(p.theta, p.scaling, p.scaling_factor, p.head_dim, p.q_heads, p.kv_heads)
            for p in problems] == [(1e4, DEFAULT, 1.0, 128, 32, 16),
                                   (1e6, LINEAR, 8.0, 128, 32, 16)]


@pytest.mark.parametrize(("model", "message"), [
    # No QK-norm: qk_norm's reason.
    ("llama-3.1-8b", "does not normalise q and k per head"),
    ("mixtral-8x7b", "does not normalise q and k per head"),
    # QK-norm, but a rotation only rope computes yet.
    (str(HF_CONFIGS / "Qwen3-VL-235B-A22B-Instruct.json"),
     "rotates with mrope \\(interleaved\\), which qk_norm_rope does not compute yet"),
])
def test_not_applicable_where_either_kernel_is_not(model, message):
    with pytest.raises(NotApplicableError, match=message):
        problems_for_model(load_model(model), "bfloat16")


# ---------------------------------------------------------------------------------------------
# Space and heuristic

SHAPES = [
    dict(head_dim=128, rotary_dim=128), dict(head_dim=128, rotary_dim=64),
    dict(head_dim=64, rotary_dim=64), dict(head_dim=256, rotary_dim=256),
    dict(head_dim=256, rotary_dim=64),
]
TOKENS = (1, 2, 7, 64, 512, 4096, 2**20)


def _thread_vectors(p, config):
    """The vector indices of the head each lane of a head's threads holds, in slot order."""
    vec = config.vector_bits // (16 if p.dtype != "float32" else 32)
    threads = 32 // config.heads_per_warp
    slots = p.head_dim // (vec * threads)
    return vec, [[v * threads + lane for v in range(slots)] for lane in range(threads)]


@pytest.mark.parametrize("style", (NEOX, GPTJ))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s['head_dim']}-r{s['rotary_dim']}")
def test_default_config_is_a_valid_point(shape, dtype, style):
    for tokens in TOKENS:
        p = problem(dtype=dtype, cache_dtype=dtype, style=style, num_tokens=tokens, **shape)
        config = default_config(p, H200)
        SPACE.check(p, config, H200)  # raises if not a valid point
        assert config.cos_sin == CACHE
    decode = default_config(problem(dtype=dtype, cache_dtype=dtype, style=style, **shape), H200)
    assert decode.warps_per_block == 1


@pytest.mark.parametrize("style", (NEOX, GPTJ))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s['head_dim']}-r{s['rotary_dim']}")
def test_every_valid_point_keeps_each_pair_in_one_thread(shape, dtype, style):
    p = problem(dtype=dtype, cache_dtype="float32", style=style, **shape)
    enumeration = SPACE.enumerate(p, H200)
    assert enumeration.declared == 2 * 3 * 6 * 5
    assert {c.cos_sin for c in enumeration.valid} == {CACHE, COMPUTED}
    for config in enumeration.valid:
        vec, lanes = _thread_vectors(p, config)
        for held in lanes:
            elements = {v * vec + e for v in held for e in range(vec)}
            if style == NEOX:
                # Each rotated element's partner half rotary_dim on is the same thread's.
                half = p.rotary_dim // 2
                assert all(j + half in elements for j in elements if j < half), config
            else:
                assert vec % 2 == 0, config
            # Every thread rotates the same number of its vectors.
            rotated = sum(v * vec < p.rotary_dim for v in held)
            assert rotated >= 1 and rotated == sum(v * vec < p.rotary_dim for v in lanes[0])
    for rejection in enumeration.rejected:
        assert rejection.constraint in {c.name for c in SPACE.constraints}


def test_a_thread_per_vector_is_refused_in_neox_style():
    # Qwen3's 128 bf16 elements in 16 threads of one 128-bit vector: a pair's halves would be
    # two threads'.
    p = problem()
    rejected = {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}
    assert rejected[QKNormRopeConfig(CACHE, 128, 2, 1)] == "rotated_part_whole_per_thread"
    assert QKNormRopeConfig(CACHE, 128, 4, 1) in SPACE.enumerate(p, H200).valid


def test_a_rotated_part_no_thread_split_serves_is_refused_by_name():
    p = problem(rotary_dim=40)
    with pytest.raises(EmptySpaceError, match="rotated_part_whole_per_thread removed"):
        default_config(p, H200)


def test_the_borrowed_constraints_say_what_their_kernels_say():
    by_name = {c.name: c.reason for c in SPACE.constraints}
    for space, names in ((rope.SPACE, {"vector_holds_whole_pairs"}),
                         (qk_norm.SPACE, {"head_splits_into_whole_vectors",
                                          "vectors_per_thread_unrollable"})):
        assert {c.name: c.reason for c in space.constraints if c.name in names} == {
            name: by_name[name] for name in names}
    p = problem(dtype="float32", cache_dtype="float32", style=GPTJ)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}
    # One fp32 element per 32-bit vector: half a pair (rope's); 64 vectors of a 128-dim head
    # for 32 threads at 32 bits, 2 each (fine), at 1 thread 128 (too many, qk_norm's).
    assert rejected[QKNormRopeConfig(CACHE, 32, 1, 1)] == "vector_holds_whole_pairs"
    assert rejected[QKNormRopeConfig(CACHE, 64, 32, 1)] == "vectors_per_thread_unrollable"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_valid_point_is_resident_on_every_device(dtype):
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            p = problem(dtype=dtype, cache_dtype=dtype, num_tokens=tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


def test_cost_by_hand():
    # Qwen3-8B bf16 at 3 tokens, half rotary (64 of 128), int64 positions, fp32 cache: 3 * 40
    # heads of 128 bf16 read and written, two weights of 128, 3 positions of 8 bytes, 3 cache
    # rows of 64 fp32.
    p = problem(num_tokens=3, rotary_dim=64, cache_dtype="float32")
    config = QKNormRopeConfig(CACHE, 64, 8, 4)
    c = cost(p, config, H200)
    assert c.bytes_moved == 2 * 3 * 40 * 128 * 2 + 2 * 128 * 2 + 3 * 8 + 3 * 64 * 4
    assert c.flops == 4 * 3 * 40 * 128 + 3 * 3 * 40 * 64
    # 8 heads a warp, 32 a block: 96 q heads in 3 blocks, 24 k heads in 1.
    assert c.blocks == 3 + 1
    assert c.threads_per_block == 128
    # 4 threads a head: 32 bf16 of the head and 16 fp32 of cos and sin each.
    assert c.bytes_in_flight_per_thread == 32 * 2 + 16 * 4
    computed = cost(p, QKNormRopeConfig(COMPUTED, 64, 8, 4), H200)
    # No cache rows; cos and sin computed once per (head, pair).
    assert computed.bytes_moved == c.bytes_moved - 3 * 64 * 4
    assert computed.flops == c.flops + rope.SINCOS_FLOPS * 3 * 40 * 32


# ---------------------------------------------------------------------------------------------
# Reference and inputs


@pytest.mark.parametrize("scaling", ({}, dict(scaling=LLAMA3, scaling_factor=8.0,
                                              low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position=8192)),
                         ids=("default", "llama3"))
@pytest.mark.parametrize(("style", "rotary_dim", "weight_bias"),
                         [(NEOX, 128, 0.0), (NEOX, 32, 1.0), (GPTJ, 64, 0.0)])
def test_reference_is_qk_norm_s_then_rope_s(style, rotary_dim, weight_bias, scaling):
    p = problem(num_tokens=9, q_heads=4, kv_heads=2, style=style, rotary_dim=rotary_dim,
                weight_bias=weight_bias, **scaling)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(5))
    norm_problem = qk_norm.QKNormProblem(num_tokens=9, dtype="bfloat16", head_dim=128,
                                         q_heads=4, kv_heads=2, eps=1e-6,
                                         weight_bias=weight_bias)
    rope_problem = rope.RopeProblem(**{name: getattr(p, name) for name in
                                       rope.RopeProblem.static_names()}, num_tokens=9)
    # The unfused chain `cutetune bench` times beside it: qk_norm's launch, then rope's, on
    # the same tensors.
    assert [(step.kernel, step.problem(p), dict(step.names)) for step in KERNEL.unfused] == [
        ("qk_norm", norm_problem, {}), ("rope", rope_problem, {})]
    normalised = qk_norm.reference(t, norm_problem)
    expected = rope.reference({**t, **normalised}, rope_problem)
    ours = reference(t, p)
    for name in ("q", "k"):
        assert torch.equal(ours[name], expected[name])
        # The part beyond rotary_dim is only normalised.
        assert torch.equal(ours[name][..., rotary_dim:], normalised[name][..., rotary_dim:])
        assert not torch.equal(ours[name], normalised[name])


def test_inputs_are_rope_s_with_qk_norm_s_weights():
    p = problem(num_tokens=5, q_heads=2, kv_heads=1)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(0))
    assert set(t) == {"positions", "q", "k", "cos_sin_cache", "q_weight", "k_weight"}
    assert t["q_weight"].shape == (128,) and t["q_weight"].dtype is torch.bfloat16
    assert not torch.equal(t["q_weight"], t["k_weight"])
    # q and k are views of one fused qkv buffer (q, k, then v).
    assert t["q"]._base is t["k"]._base and t["q"].stride(0) == (2 + 2 * 1) * 128
    cache = t["cos_sin_cache"]
    assert not cache[t["positions"]].isnan().any() and math.isnan(float(cache[:, 0].sum()))
