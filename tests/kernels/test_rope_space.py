"""rope's Problem, Config space, seed heuristic, cost, reference and model problems (no
compiling)."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.kernels.rope import (
    CACHE,
    COMPUTED,
    DEFAULT,
    GPTJ,
    KERNEL,
    LINEAR,
    LLAMA3,
    NEOX,
    SPACE,
    YARN,
    RopeConfig,
    RopeProblem,
    cos_sin_table,
    cost,
    default_config,
    make_inputs,
    problems_for_model,
    reference,
    yarn_attention_factor,
)
from cutetune.kernels.rope_frequencies import inverse_frequencies
from cutetune.spaces.models import PRESETS, PRESETS_DIR, load_model, model_from_hf_config

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


LLAMA3_FIELDS = dict(scaling=LLAMA3, scaling_factor=8.0, low_freq_factor=1.0,
                     high_freq_factor=4.0, original_max_position=8192)
# Qwen3's long-context YaRN, as its model cards give it (transformers' beta and truncate).
YARN_FIELDS = dict(scaling=YARN, scaling_factor=4.0, original_max_position=32768,
                   attention_factor=0.1 * math.log(4.0) + 1)


# Gemma 3 4B to 27B's full-attention layers.
LINEAR_FIELDS = dict(scaling=LINEAR, scaling_factor=8.0)


def problem(**overrides) -> RopeProblem:
    values = dict(num_tokens=1, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=32,
                  kv_heads=8, style=NEOX, positions_dtype="int64", cache_dtype="bfloat16",
                  theta=1e6)
    values.update(overrides)
    return RopeProblem(**values)


def test_registered_under_its_name():
    assert get_kernel("rope") is KERNEL
    assert KERNEL.space is SPACE
    assert KERNEL.problem_type is RopeProblem


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "int8", "dtype 'int8' not supported"),
    ("rotary_dim", 130, "rotary_dim 130 must be even and in"),
    ("rotary_dim", 63, "rotary_dim 63 must be even"),
    ("rotary_dim", 0, "rotary_dim 0 must be even"),
    ("q_heads", 0, "head counts must be positive"),
    ("style", "llama", "style 'llama' not supported"),
    ("positions_dtype", "int16", "positions_dtype 'int16' not supported"),
    ("cache_dtype", "float16", "cache_dtype 'float16' must be float32 or the dtype"),
    ("theta", 1.0, "theta must be a finite number above 1"),
    ("theta", math.inf, "theta must be a finite number above 1"),
    ("num_tokens", 0, "num_tokens must be a positive integer"),
    ("scaling", "longrope", "scaling 'longrope' not supported: use default or llama3 or yarn "
                            "or linear"),
    ("scaling_factor", 8.0, "the default scaling takes no factors, got scaling_factor=8.0"),
    ("beta_fast", 16.0, "the default scaling takes no factors, got beta_fast=16.0"),
    ("truncate", 0, "truncate must be True or False, got 0"),
])
def test_problem_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        problem(**{field: value})


@pytest.mark.parametrize("overrides", [
    dict(scaling_factor=0.5), dict(low_freq_factor=4.0, high_freq_factor=1.0),
    dict(original_max_position=0),
])
def test_llama3_scaling_validation(overrides):
    values = dict(LLAMA3_FIELDS, **overrides)
    with pytest.raises(ValueError, match="llama3 scaling needs scaling_factor >= 1"):
        problem(**values)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(scaling_factor=0.5), "yarn scaling needs scaling_factor >= 1"),
    (dict(original_max_position=0), "yarn scaling needs"),
    (dict(beta_fast=1.0, beta_slow=2.0), "0 < beta_slow <= beta_fast"),
    (dict(beta_slow=0.0), "0 < beta_slow <= beta_fast"),
    (dict(attention_factor=0.0), "attention_factor > 0, got scaling_factor=4.0, "
                                 "original_max_position=32768, beta_fast=32.0, beta_slow=1.0, "
                                 "truncate=True, attention_factor=0.0"),
    (dict(low_freq_factor=2.0), "the yarn scaling takes no factors, got low_freq_factor=2.0"),
])
def test_yarn_scaling_validation(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        problem(**dict(YARN_FIELDS, **overrides))


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(scaling_factor=0.0), "linear scaling needs a finite scaling_factor > 0, got "
                               "scaling_factor=0.0"),
    (dict(scaling_factor=-2.0), "linear scaling needs a finite scaling_factor > 0"),
    (dict(scaling_factor=math.inf), "linear scaling needs a finite scaling_factor > 0"),
    (dict(original_max_position=8192), "the linear scaling takes no factors, got "
                                       "original_max_position=8192"),
])
def test_linear_scaling_validation(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        problem(**dict(LINEAR_FIELDS, **overrides))


def test_linear_scaling_divides_every_frequency():
    p = problem(**LINEAR_FIELDS)
    assert (p.linear, p.llama3, p.yarn) == (8.0, None, None)
    assert p.frequency_scaling == (LINEAR, (8.0,))
    assert problem().frequency_scaling == ("default", ()) and problem().linear is None
    plain = inverse_frequencies(128, 1e6)
    torch.testing.assert_close(inverse_frequencies(128, 1e6, linear=p.linear), plain / 8,
                               rtol=1e-15, atol=0)
    # Position p of the scaled table is position p / 8 of theta's (dividing by 8 is exact).
    positions = torch.tensor([0, 3, 1000, 2**17 - 1])
    assert torch.equal(cos_sin_table(positions, 128, 1e6, linear=8.0),
                       cos_sin_table(positions.double() / 8, 128, 1e6))


def test_linear_frequencies_are_transformers_own():
    """Gemma 3 27B's full-attention layers: the problem's frequencies are transformers'
    _compute_linear_scaling_rope_parameters' of the same config."""
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = json.loads((HF_CONFIGS / "gemma-3-27b-it.json").read_text())
    sliding, full = problems_for_model(model_from_hf_config(raw, name="m"), "bfloat16")
    assert (sliding.scaling, full.scaling, full.linear) == ("default", LINEAR, 8.0)
    config = CONFIG_MAPPING["gemma3"](**raw).get_text_config()
    theirs, attention_factor = rope_utils.ROPE_INIT_FUNCTIONS["linear"](
        config, "cpu", layer_type="full_attention")
    ours = inverse_frequencies(full.rotary_dim, full.theta, linear=full.linear)
    assert attention_factor == 1.0
    # transformers computes in fp32.
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)
    assert (ours < inverse_frequencies(full.rotary_dim, full.theta)).all()


def test_llama3_takes_no_yarn_fields():
    with pytest.raises(ValueError, match="the llama3 scaling takes no factors, got "
                                         "truncate=False"):
        problem(**LLAMA3_FIELDS, truncate=False)


def test_problem_key_is_static_part_only():
    assert problem(num_tokens=1).static_key() == problem(num_tokens=4096).static_key()
    assert problem().static_tuple() == ("bfloat16", 128, 128, 32, 8, NEOX, "int64", "bfloat16",
                                        1e6, "default", 1.0, 1.0, 1.0, 0, 32.0, 1.0, True,
                                        1.0, "none", 0, 0, 0)
    assert problem().static_key() != problem(style=GPTJ).static_key()


# ---------------------------------------------------------------------------------------------
# Model problems


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("qwen3")] + [
    "mixtral-8x7b"])
def test_problems_of_plain_theta_presets(name):
    model = PRESETS[name]
    (p,) = problems_for_model(model, "bfloat16")
    assert p == problem(q_heads=model.num_q_heads, kv_heads=model.num_kv_heads,
                        theta=model.ropes[0].theta)


def test_partial_rotary_model_rotates_its_share():
    (p,) = problems_for_model(load_model(str(HF_CONFIGS / "GLM-4.5.json")), "bfloat16")
    assert (p.head_dim, p.rotary_dim) == (128, 64)


def test_gemma_3_has_a_problem_per_theta():
    problems = problems_for_model(load_model(str(HF_CONFIGS / "gemma-3-1b-it.json")), "float16")
    assert sorted(p.theta for p in problems) == [1e4, 1e6]
    assert {(p.head_dim, p.rotary_dim, p.cache_dtype) for p in problems} == {
        (256, 256, "float16")}


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b"])
def test_llama_3_1_takes_its_scaling(name):
    model = PRESETS[name]
    (p,) = problems_for_model(model, "bfloat16")
    assert p == problem(q_heads=model.num_q_heads, kv_heads=8, theta=5e5, **LLAMA3_FIELDS)
    assert p.llama3 == (8.0, 1.0, 4.0, 8192)


def test_llama3_frequencies_are_transformers_own():
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    config = LlamaConfig(head_dim=128, hidden_size=4096, num_attention_heads=32,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192},
                         rope_theta=5e5)
    theirs, attention_factor = rope_utils.ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = inverse_frequencies(128, 5e5, (8.0, 1.0, 4.0, 8192))
    assert attention_factor == 1.0
    # transformers computes in fp32; the scaling changes about half the frequencies.
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)
    plain = inverse_frequencies(128, 5e5)
    assert 20 < int((ours != plain).sum()) < 64 and (ours <= plain).all()


# YaRN as configs state it: Qwen3's (transformers' defaults but factor and context), gpt-oss's
# (untruncated ramp ends), and one of a half-rotated head with its own betas and DeepSeek's
# mscale pair, and one stating its attention_factor.
YARN_CONFIGS = [
    pytest.param({**json.loads((PRESETS_DIR / "qwen3-8b.json").read_text()),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32768}}, id="qwen3-8b"),
    pytest.param(json.loads((HF_CONFIGS / "gpt-oss-20b.json").read_text()), id="gpt-oss-20b"),
    pytest.param({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                  "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                  "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "beta_fast": 16,
                                   "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
                                   "original_max_position_embeddings": 4096}},
                 id="partial-mscale"),
    pytest.param({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
                  "rope_theta": 1e6,
                  "rope_scaling": {"type": "yarn", "factor": 4.0, "attention_factor": 1.25,
                                   "original_max_position_embeddings": 32768}},
                 id="qwen2.5-attention-factor"),
]


@pytest.mark.parametrize("raw", YARN_CONFIGS)
def test_yarn_frequencies_and_attention_factor_are_transformers_own(raw):
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    (p,) = problems_for_model(model_from_hf_config(raw, name="m"), "bfloat16")
    theirs, attention_factor = rope_utils.ROPE_INIT_FUNCTIONS["yarn"](
        CONFIG_MAPPING[raw["model_type"]](**raw), "cpu")
    assert p.scaling == YARN and p.yarn[3] == p.attention_factor
    assert p.attention_factor == pytest.approx(attention_factor, rel=1e-12)
    ours = inverse_frequencies(p.rotary_dim, p.theta, yarn=p.yarn)
    # transformers computes in fp32; the ramp leaves some pairs as they are and divides others.
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)
    plain = inverse_frequencies(p.rotary_dim, p.theta)
    assert (ours == plain).any() and (ours < plain).any() and (ours <= plain).all()


def test_gpt_oss_takes_its_yarn():
    (p,) = problems_for_model(load_model(str(HF_CONFIGS / "gpt-oss-20b.json")), "bfloat16")
    assert p == problem(head_dim=64, rotary_dim=64, q_heads=64, kv_heads=8, theta=150000.0,
                        scaling=YARN, scaling_factor=32.0, original_max_position=4096,
                        truncate=False, attention_factor=yarn_attention_factor(32.0))
    assert p.attention_factor == pytest.approx(0.1 * math.log(32) + 1)


@pytest.mark.parametrize(("scaling", "context"), [
    ({"rope_type": "yarn", "factor": 4.0}, 40960),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768),
])
def test_yarn_context_is_transformers_own(scaling, context):
    raw = {**json.loads((PRESETS_DIR / "qwen3-8b.json").read_text()), "rope_scaling": scaling}
    (p,) = problems_for_model(model_from_hf_config(raw, name="m"), "bfloat16")
    assert raw["max_position_embeddings"] == 40960 and p.original_max_position == context


def test_a_scaling_that_states_no_factor_is_not_applicable():
    raw = {"model_type": "qwen3", "rope_theta": 1e6,
           "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}
    with pytest.raises(NotApplicableError, match="model m's yarn scaling states no factor$"):
        problems_for_model(model_from_hf_config(raw, name="m"), "bfloat16")


def test_yarn_table_holds_the_attention_factor():
    # vLLM's YaRN cache: cos and sin times the attention factor, so position 0 reads it.
    p = problem(**YARN_FIELDS)
    table = cos_sin_table(torch.tensor([0, 5]), 128, 1e6, yarn=p.yarn)
    assert torch.equal(table[0], torch.cat((torch.full((64,), p.attention_factor,
                                                       dtype=torch.float64),
                                            torch.zeros(64, dtype=torch.float64))))
    cos, sin = table[1].chunk(2)
    torch.testing.assert_close(cos**2 + sin**2, torch.full((64,), p.attention_factor**2,
                                                           dtype=torch.float64))


@pytest.mark.parametrize(("model", "q_heads", "theta", "scaling"), [
    ("deepseek-v3", 128, 1e4, YARN),
    ("tests/data/hf_configs/Kimi-K2-Instruct.json", 64, 5e4, YARN),
    ("tests/data/hf_configs/GLM-4.7-Flash.json", 20, 1e6, DEFAULT),
])
def test_mla_rotates_the_rope_dims_of_q_and_the_shared_k_head_in_interleaved_pairs(
        model, q_heads, theta, scaling):
    (p,) = problems_for_model(load_model(model), "bfloat16")
    assert (p.head_dim, p.rotary_dim, p.q_heads, p.kv_heads, p.style) == (64, 64, q_heads, 1,
                                                                         GPTJ)
    assert (p.theta, p.scaling) == (theta, scaling)
    if scaling == YARN:
        # mscale and mscale_all_dim are both 1: the ratio transformers takes is 1.
        assert p.attention_factor == 1.0 and p.original_max_position == 4096


def test_mla_without_interleaved_weights_rotates_halves():
    raw = {**json.loads((PRESETS_DIR / "deepseek-v3.json").read_text()),
           "rope_interleave": False}
    (p,) = problems_for_model(model_from_hf_config(raw, name="m"), "bfloat16")
    assert p.style == NEOX


def test_not_applicable_without_a_stated_theta():
    # Qwen3's config class has a default theta, which cutetune does not read (its Family
    # states none).
    bare = model_from_hf_config({"model_type": "qwen3"}, name="bare")
    assert bare.ropes == ()
    with pytest.raises(NotApplicableError, match="model bare's config states no rope_theta"):
        problems_for_model(bare, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Space and heuristic

SHAPES = [
    dict(head_dim=128, rotary_dim=128), dict(head_dim=128, rotary_dim=64),
    dict(head_dim=64, rotary_dim=64), dict(head_dim=256, rotary_dim=256),
    dict(head_dim=256, rotary_dim=64), dict(head_dim=64, rotary_dim=16),
]
TOKENS = (1, 2, 7, 64, 512, 4096, 2**20)


@pytest.mark.parametrize("style", (NEOX, GPTJ))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s['head_dim']}-r{s['rotary_dim']}")
def test_default_config_is_a_valid_point(shape, dtype, style):
    for tokens in TOKENS:
        p = problem(dtype=dtype, cache_dtype=dtype, style=style, num_tokens=tokens, **shape)
        config = default_config(p, H200)
        SPACE.check(p, config, H200)  # raises if not a valid point
        assert config.cos_sin == CACHE
    # Decode: one head per thread; the widest vector the rotated part splits into.
    decode = default_config(problem(dtype=dtype, cache_dtype=dtype, style=style, **shape), H200)
    assert (decode.heads_per_thread, decode.warps_per_block) == (1, 1)
    assert decode.vector_bits == 128 or shape["rotary_dim"] == 16


@pytest.mark.parametrize("style", (NEOX, GPTJ))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s['head_dim']}-r{s['rotary_dim']}")
def test_every_valid_point_tiles_the_rotated_part(shape, dtype, style):
    p = problem(dtype=dtype, cache_dtype="float32", style=style, **shape)
    enumeration = SPACE.enumerate(p, H200)
    assert enumeration.declared == 2 * 3 * 4 * 5
    assert enumeration.valid
    element_bits = 16 if dtype != "float32" else 32
    for config in enumeration.valid:
        vec = config.vector_bits // element_bits
        pairs = vec if style == NEOX else vec // 2
        assert pairs >= 1 and (p.rotary_dim // 2) % pairs == 0, config
        assert p.head_dim % vec == 0, config
    assert {c.cos_sin for c in enumeration.valid} == {CACHE, COMPUTED}
    for rejection in enumeration.rejected:
        assert rejection.constraint in {c.name for c in SPACE.constraints}


def test_gptj_needs_whole_pairs_in_a_vector():
    # One fp32 element per 32-bit vector: half a pair.
    p = problem(dtype="float32", cache_dtype="float32", style=GPTJ)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}
    assert rejected[RopeConfig(CACHE, 32, 1, 1)] == "vector_holds_whole_pairs"
    assert RopeConfig(CACHE, 32, 1, 1) in SPACE.enumerate(problem(dtype="float32",
                                                                  cache_dtype="float32"),
                                                          H200).valid


def test_a_narrow_rotary_part_refuses_wide_vectors():
    # rotary_dim 16 in NeoX style: halves of 8 bf16 elements take one 128-bit vector each;
    # rotary_dim 8 (halves of 4) only 64-bit ones.
    valid = SPACE.enumerate(problem(head_dim=64, rotary_dim=8), H200)
    bits = {c.vector_bits for c in valid.valid}
    assert bits == {32, 64}
    assert {r.constraint for r in valid.rejected if r.config.vector_bits == 128} == {
        "rotary_splits_into_whole_vectors"}


def test_heads_per_thread_beyond_the_heads_is_refused():
    p = problem(q_heads=2, kv_heads=1)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}
    assert rejected[RopeConfig(CACHE, 128, 4, 1)] == "heads_per_thread_within_q"


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
    # Qwen3-8B bf16 at 3 tokens, half rotary (64 of 128), int64 positions, fp32 cache:
    # 3 * 40 heads * 64 rotated elements of 2 bytes read and written, 3 positions of 8 bytes,
    # 3 cache rows of 64 fp32.
    p = problem(num_tokens=3, rotary_dim=64, cache_dtype="float32")
    config = RopeConfig(CACHE, 128, 2, 4)
    c = cost(p, config, H200)
    assert c.bytes_moved == 2 * 3 * 40 * 64 * 2 + 3 * 8 + 3 * 64 * 4
    assert c.flops == 3 * 3 * 40 * 64
    # 32 pairs per head in chunks of 8: 4 threads a chunk of heads; 16 q and 4 k groups of 2.
    assert c.blocks == math.ceil(3 * 4 * (16 + 4) / 128) == 2
    assert c.threads_per_block == 128
    # Two heads' chunks of 8 bf16 in each half loaded before the first store.
    assert c.bytes_in_flight_per_thread == 2 * 8 * 2 * 2
    computed = cost(p, RopeConfig(COMPUTED, 128, 2, 4), H200)
    # No cache rows; cos and sin computed once per (token, head group, pair).
    assert computed.bytes_moved == c.bytes_moved - 3 * 64 * 4
    assert computed.flops == c.flops + 40 * 3 * 20 * 32


# ---------------------------------------------------------------------------------------------
# Reference and inputs


def _hf_neox(x, cos, sin):
    """transformers' apply_rotary_pos_emb on the rotated part (rotate_half)."""
    rotated, rest = x[..., :2 * cos.shape[-1]], x[..., 2 * cos.shape[-1]:]
    half = cos.shape[-1]
    cos2 = torch.cat((cos, cos), -1)[:, None]
    sin2 = torch.cat((sin, sin), -1)[:, None]
    turned = torch.cat((-rotated[..., half:], rotated[..., :half]), -1)
    return torch.cat((rotated * cos2 + turned * sin2, rest), -1)


def _complex_gptj(x, angles):
    """GPT-J's rotation as a complex product of (even + i odd) with e^(i angle)."""
    pairs = angles.shape[-1]
    rotated = torch.view_as_complex(x[..., :2 * pairs].reshape(*x.shape[:-1], pairs, 2)
                                    .contiguous())
    turned = torch.view_as_real(rotated * torch.polar(torch.ones_like(angles), angles)[:, None])
    return torch.cat((turned.flatten(-2), x[..., 2 * pairs:]), -1)


@pytest.mark.parametrize("rotary_dim", (128, 32))
@pytest.mark.parametrize("style", (NEOX, GPTJ))
def test_reference_matches_the_textbook_forms(style, rotary_dim):
    p = problem(num_tokens=9, q_heads=4, kv_heads=2, style=style, rotary_dim=rotary_dim,
                dtype="float32", cache_dtype="float32", theta=5e5)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(3))
    expected = reference(t, p)
    angles = t["positions"].double()[:, None] * (
        5e5 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    for name in ("q", "k"):
        x = t[name].double()
        textbook = (_hf_neox(x, angles.cos(), angles.sin()) if style == NEOX
                    else _complex_gptj(x, angles))
        torch.testing.assert_close(expected[name].double(), textbook, rtol=1e-6, atol=1e-6)
        # The part beyond rotary_dim is the input's.
        assert torch.equal(expected[name][..., rotary_dim:], t[name][..., rotary_dim:])


def test_inputs_hold_the_rows_of_their_positions_only():
    p = problem(num_tokens=5, q_heads=2, kv_heads=1, cache_dtype="bfloat16")
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(0))
    cache = t["cos_sin_cache"]
    assert cache.dtype is torch.bfloat16 and cache.shape[1] == 128
    rows = t["positions"]
    assert rows.dtype is torch.int64 and int(rows.max()) < cache.shape[0]
    torch.testing.assert_close(cache[rows].double(), cos_sin_table(rows, 128, 1e6),
                               rtol=0, atol=2**-8)
    others = torch.ones(cache.shape[0], dtype=torch.bool)
    others[rows] = False
    assert cache[others].isnan().all()
    # q and k are views of one fused qkv buffer (q, k, then v).
    assert t["q"]._base is t["k"]._base and t["q"].stride(0) == (2 + 2 * 1) * 128


def test_cos_sin_table_is_exact_at_long_context():
    # An fp32 angle at position 2^17 would be off by up to 2^17 * 2^-24 rad.
    position = torch.tensor([2**17 - 1])
    table = cos_sin_table(position, 128, 1e4)
    assert table.dtype is torch.float64
    assert abs(float(table[0, 0]) - math.cos(2**17 - 1)) < 1e-12
