"""cutetune reads every committed config (the presets and public configs of other models) as
transformers does: the config built by transformers' own config class, the model built from it
by transformers' own modeling code (on the meta device: shapes, no weights), and what those
modules hold (each norm's width, eps and weight offset, each layer's MLP, the experts, the
router's top-k, the activation) compared with cutetune's reading. Bare configs of each
model_type cutetune accepts check the config classes' defaults the same way."""

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModel  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from cutetune.spaces.hf_config import (  # noqa: E402
    CLAMPED_SWIGLU,
    FAMILIES,
    FAMILY_OF_TYPE,
    REFUSED_TYPES,
    UnknownModelError,
)
from cutetune.spaces.models import PRESETS_DIR, load_model, model_from_hf_config  # noqa: E402

HELD_OUT_DIR = Path(__file__).parents[1] / "data" / "hf_configs"
CONFIG_FILES = sorted(PRESETS_DIR.glob("*.json")) + sorted(HELD_OUT_DIR.glob("*.json"))
# Configs whose model_type transformers has no class for, with the class their code names
# (Kimi-K2's auto_map names DeepSeek-V3's configuration and modeling code).
CLASS_OF_TYPE = {"kimi_k2": "deepseek_v3"}


def transformers_model(raw: dict):
    """transformers' text model for a config, built on the meta device."""
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    model_type = raw.get("model_type")
    config = CONFIG_MAPPING[CLASS_OF_TYPE.get(model_type, model_type)](**raw)
    with torch.device("meta"):
        return AutoModel.from_config(config.get_text_config())


def norm_offset(norm: torch.nn.Module) -> float:
    """The weight offset of a norm class: its output for a zero weight, on ones."""
    probe = type(norm)(8)
    with torch.no_grad():
        probe.weight.zero_()
        return float(round(float(probe(torch.ones(1, 8)).mean())))  # eps moves it by 1e-6


def norm_eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def expert_width(experts: torch.nn.Module, hidden: int) -> int:
    """The experts' intermediate width: gate_up_proj stacks gate and up, (E, 2I, H) or
    (E, H, 2I) by family."""
    dims = experts.gate_up_proj.shape[1:]
    (doubled,) = [d for d in dims if d != hidden] or [hidden]
    return doubled // 2


def what_transformers_builds(raw: dict) -> dict:
    """The fields cutetune reads, as transformers' modules hold them."""
    model = transformers_model(raw)
    hidden = model.config.hidden_size
    seen: dict = {"hidden": set(), "qk": set(), "low_rank": set(), "dense": set(),
                  "experts": set(), "top_k": set(), "shared": set(), "act": set()}
    norms = [("norm", model.norm)]
    for layer in model.layers:
        norms += [(name, module) for name, module in layer.named_modules()
                  if "RMSNorm" in type(module).__name__]
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            seen["experts"].add((mlp.experts.gate_up_proj.shape[0],
                                 expert_width(mlp.experts, hidden)))
            router = getattr(mlp, "gate", None) or mlp.router
            seen["top_k"].add(router.top_k)
            shared = getattr(mlp, "shared_experts", None) or getattr(mlp, "shared_expert", None)
            if shared is not None and shared.gate_proj.out_features:  # width 0: no work
                seen["shared"].add(shared.gate_proj.out_features)
            act = getattr(mlp.experts, "act_fn", None)
            seen["act"].add(CLAMPED_SWIGLU if hasattr(mlp.experts, "limit") else type(act))
        else:
            seen["dense"].add(mlp.gate_proj.out_features)
            seen["act"].add(type(mlp.act_fn))
    # Gemma's ScaledWordEmbedding keeps its scale as a float; a plain nn.Embedding has none.
    seen["embedding_scale"] = getattr(model.embed_tokens, "scalar_embed_scale", 1.0)
    for name, norm in norms:
        if "linear_attn" in name:
            continue  # Qwen3-Next's gated norm: another kernel, not planned
        entry = (norm.weight.shape[0], norm_eps(norm), norm_offset(norm))
        if name.endswith(("q_norm", "k_norm")):
            seen["qk"].add(entry)
        elif name.endswith(("q_a_layernorm", "kv_a_layernorm")):
            seen["low_rank"].add(entry)
        else:
            seen["hidden"].add(entry)
    return seen


def _one(values: set):
    assert len(values) <= 1, values
    return next(iter(values), None)


@pytest.mark.parametrize("raw", [
    *[pytest.param(json.loads(path.read_text()), id=path.stem) for path in CONFIG_FILES],
    *[pytest.param({"model_type": t}, id=f"bare-{t}") for t in sorted(FAMILY_OF_TYPE)],
    pytest.param({"model_type": "deepseek_v3", "q_lora_rank": None}, id="q-not-low-rank"),
    pytest.param({"model_type": "qwen3_moe", "mlp_only_layers": [0, 5]}, id="mlp-only-layers"),
    pytest.param({"model_type": "qwen3_next", "decoder_sparse_step": 2}, id="sparse-step"),
    pytest.param({"model_type": "glm4_moe", "use_qk_norm": True}, id="glm-qk-norm"),
    pytest.param({"model_type": "glm4_moe_lite", "num_hidden_layers": 3,
                  "mlp_layer_types": ["sparse", "dense", "sparse"]}, id="mlp-layer-types"),
    pytest.param({"model_type": "deepseek_v3", "n_shared_experts": 0}, id="no-shared-experts"),
    pytest.param({"model_type": "deepseek_v3", "first_k_dense_replace": 0}, id="no-dense"),
])
def test_reading_matches_what_transformers_builds(raw):
    ours = model_from_hf_config(raw, name="m")
    built = what_transformers_builds(raw)

    assert built["hidden"] == {(ours.hidden_size, ours.rms_norm_eps, ours.norm_weight_bias)}
    assert ours.embedding_scale == built["embedding_scale"]
    qk = _one(built["qk"])
    assert ours.qk_norm == (qk is not None)
    if qk is not None:
        assert qk == (ours.head_dim, ours.rms_norm_eps, ours.norm_weight_bias)
    low_rank = sorted(built["low_rank"])
    assert sorted(ours.extra_norm_widths) == [width for width, _, _ in low_rank]
    assert {(eps, offset) for _, eps, offset in low_rank} <= {
        (ours.extra_norm_eps, ours.norm_weight_bias)}

    assert ours.intermediate_size == _one(built["dense"])
    experts = _one(built["experts"])
    assert (ours.num_experts, ours.expert_intermediate) == (experts or (None, None))
    assert ours.experts_per_token == _one(built["top_k"])
    assert ours.shared_expert_intermediate == _one(built["shared"])
    act = _one(built["act"])
    assert act == (ours.hidden_act if ours.hidden_act == CLAMPED_SWIGLU
                   else type(ACT2FN[ours.hidden_act]))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_heads_match_the_attention_projections(path):
    """q and k heads of a per-head qk-norm model, from its attention's projections."""
    raw = json.loads(path.read_text())
    ours = model_from_hf_config(raw, name="m")
    if not ours.qk_norm:
        return
    attention = next(layer.self_attn for layer in transformers_model(raw).layers
                     if hasattr(layer, "self_attn"))
    assert attention.q_proj.out_features // ours.head_dim in (ours.num_q_heads,
                                                               2 * ours.num_q_heads)
    assert attention.k_proj.out_features == ours.num_kv_heads * ours.head_dim


@pytest.mark.parametrize("raw", [
    *[pytest.param(json.loads(path.read_text()), id=path.stem) for path in CONFIG_FILES],
    *[pytest.param({"model_type": t}, id=f"bare-{t}") for t in sorted(FAMILY_OF_TYPE)],
    pytest.param({"model_type": "deepseek_v3", "qk_rope_head_dim": 32, "qk_nope_head_dim": 96,
                  "v_head_dim": 64, "rope_interleave": False}, id="mla-dims"),
    pytest.param({"model_type": "deepseek_v3", "rope_interleave": None}, id="mla-null-interleave"),
])
def test_mla_heads_match_the_attention_projections(raw):
    """An MLA model's heads from its attention's projections: q's heads of nope then rope
    dims, k's rotated part the tail of the kv_a projection, the values' width from kv_b; and
    whether it rotates interleaved pairs, as its attention reads the config."""
    ours = model_from_hf_config(raw, name="m")
    model = transformers_model(raw)
    attention = next(layer.self_attn for layer in model.layers if hasattr(layer, "self_attn"))
    if not hasattr(attention, "kv_a_proj_with_mqa"):
        assert ours.mla is None
        return
    mla = ours.mla
    assert (ours.num_q_heads, ours.num_kv_heads, ours.head_dim) == (None, None, None)
    q_proj = getattr(attention, "q_b_proj", None) or attention.q_proj
    assert q_proj.out_features == mla.q_heads * (mla.nope_head_dim + mla.rope_head_dim)
    assert attention.kv_a_proj_with_mqa.out_features == (model.config.kv_lora_rank
                                                          + mla.rope_head_dim)
    assert attention.kv_b_proj.out_features == mla.q_heads * (mla.nope_head_dim
                                                               + mla.value_head_dim)
    assert mla.interleaved == bool(model.config.rope_interleave)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_types[0])
def test_family_defaults_are_the_config_class_defaults(family):
    """Each default cutetune takes for a missing field is the config class's (None where the
    class derives it). The thetas transformers 5 holds in rope_parameters, per kind of layer:
    Gemma 3's sliding-window layers rotate by rope_local_base_freq, the others by
    rope_theta."""
    config = CONFIG_MAPPING[family.model_types[0]]()
    rope = config.rope_parameters
    thetas = {"rope_theta": rope.get("full_attention", rope).get("rope_theta"),
              "rope_local_base_freq": rope.get("sliding_attention", {}).get("rope_theta")}
    for key, default in family.defaults.items():
        if default is not None:
            got = thetas[key] if key in thetas else getattr(config, key)
            assert got == default, key


def test_every_committed_model_type_has_a_family():
    types = {json.loads(path.read_text()).get("model_type") for path in CONFIG_FILES}
    assert types <= set(FAMILY_OF_TYPE)
    assert len(list(HELD_OUT_DIR.glob("*.json"))) >= 8


@pytest.mark.parametrize("model_type", ["olmo3", "falcon", None])
def test_an_unknown_model_type_is_refused_by_name(model_type):
    raw = {"hidden_size": 1024} | ({"model_type": model_type} if model_type else {})
    with pytest.raises(UnknownModelError) as info:
        model_from_hf_config(raw, name="m")
    message = str(info.value)
    assert "\n" not in message
    assert (repr(model_type) if model_type else "no model_type") in message
    assert "qwen3_next" in message  # the accepted types are listed


@pytest.mark.parametrize("model_type", sorted(REFUSED_TYPES))
def test_a_norm_cutetune_cannot_express_is_refused_with_the_reason(model_type):
    with pytest.raises(UnknownModelError, match="is not served: .* norm"):
        model_from_hf_config({"model_type": model_type}, name="m")


def test_qwen3_next_norms_scale_by_one_plus_w():
    model = load_model(str(HELD_OUT_DIR / "Qwen3-Next-80B-A3B-Instruct.json"))
    assert model.norm_weight_bias == 1.0
    assert model.intermediate_size is None  # every layer routes: no dense MLP to tune


def test_glm_4_7_flash_takes_the_config_class_eps():
    model = load_model(str(HELD_OUT_DIR / "GLM-4.7-Flash.json"))
    assert model.rms_norm_eps == 1e-5
    assert model.extra_norm_eps == 1e-6  # its MLA norms are built with their class default
