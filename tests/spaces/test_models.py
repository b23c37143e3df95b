"""Model shapes: the public presets and Hugging Face config.json files."""

import json

import pytest

from cutetune.spaces.hf_config import CLAMPED_SWIGLU, NULL_MEANS_NONE, UnknownModelError
from cutetune.spaces.models import PRESETS, ModelShape, load_model
from testkit.malformed_configs import BAD_MODEL_PATHS, BASE_OF_FIELD, MALFORMED

# The models' published configurations: hidden, q heads, kv heads, head dim, eps, qk-norm, MoE
# experts/top-k.
TABLE = {
    "qwen3-0.6b": (1024, 16, 8, 128, 1e-6, True, None, None),
    "qwen3-8b": (4096, 32, 8, 128, 1e-6, True, None, None),
    "qwen3-32b": (5120, 64, 8, 128, 1e-6, True, None, None),
    "qwen3-30b-a3b": (2048, 32, 4, 128, 1e-6, True, 128, 8),
    "qwen3-235b-a22b": (4096, 64, 4, 128, 1e-6, True, 128, 8),
    "llama-3.1-8b": (4096, 32, 8, 128, 1e-5, False, None, None),
    "llama-3.1-8b-fp4": (4096, 32, 8, 128, 1e-5, False, None, None),
    "llama-3.1-70b": (8192, 64, 8, 128, 1e-5, False, None, None),
    "deepseek-v3": (7168, None, None, None, 1e-6, False, 256, 8),
    "mixtral-8x7b": (4096, 32, 8, 128, 1e-5, False, 8, 2),
}


def test_presets_are_the_design_table():
    assert set(PRESETS) == set(TABLE)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_preset_loads_by_name_case_insensitively(name):
    for spelling in (name, name.upper(), name.title()):
        model = load_model(spelling)
        assert model is PRESETS[name]
    m = PRESETS[name]
    assert (m.hidden_size, m.num_q_heads, m.num_kv_heads, m.head_dim, m.rms_norm_eps,
            m.qk_norm, m.num_experts, m.experts_per_token) == TABLE[name]


def test_unknown_name_lists_the_presets():
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-17'") as info:
        load_model("gpt-17")
    for name in PRESETS:
        assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def _write(path, raw) -> str:
    path.write_text(json.dumps(raw))
    return str(path)


QWEN3_8B_HF = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "rms_norm_eps": 1e-06,
}


def test_flat_qwen3_config(tmp_path):
    model = load_model(_write(tmp_path / "config.json", QWEN3_8B_HF))
    assert model == ModelShape(name=tmp_path.name, hidden_size=4096, num_q_heads=32,
                               num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, qk_norm=True,
                               intermediate_size=12288, vocab_size=151936)


def test_directory_holding_config_json(tmp_path):
    model_dir = tmp_path / "Qwen3-8B"
    model_dir.mkdir()
    _write(model_dir / "config.json", QWEN3_8B_HF)
    model = load_model(str(model_dir))
    assert model.name == "Qwen3-8B"
    assert (model.hidden_size, model.num_q_heads, model.num_kv_heads, model.head_dim) == (
        4096, 32, 8, 128)
    assert model.qk_norm


def test_nested_text_config(tmp_path):
    raw = {
        "model_type": "qwen3_vl",
        "vision_config": {"hidden_size": 1152, "num_heads": 16},
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_size": 2560,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
        },
    }
    model = load_model(_write(tmp_path / "config.json", raw))
    # The text model's fields, not the vision tower's; model_type from the outer config.
    assert (model.hidden_size, model.num_q_heads, model.num_kv_heads, model.head_dim) == (
        2560, 32, 8, 128)
    assert model.qk_norm


def test_mixtral_style_moe(tmp_path):
    raw = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
    }
    model = load_model(_write(tmp_path / "config.json", raw))
    assert model.num_experts == 8
    assert model.experts_per_token == 2
    assert model.rms_norm_eps == 1e-5
    assert not model.qk_norm
    # No head_dim in the file: hidden / heads.
    assert model.head_dim == 128
    # Every layer routes: intermediate_size is the experts' width, no dense MLP runs.
    assert (model.expert_intermediate, model.intermediate_size) == (14336, None)


def test_qwen3_moe_config(tmp_path):
    raw = {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "rms_norm_eps": 1e-6,
    }
    model = load_model(_write(tmp_path / "config.json", raw))
    assert model.qk_norm
    assert (model.num_experts, model.experts_per_token, model.expert_intermediate) == (
        128, 8, 768)
    # Every layer routes (decoder_sparse_step 1, no mlp_only_layers): the config class's
    # dense width (6144) is never run.
    assert model.intermediate_size is None


@pytest.mark.parametrize(("layout", "dense"), [
    ({"mlp_only_layers": [0]}, 6144), ({"decoder_sparse_step": 2}, 6144),
    ({"mlp_only_layers": [], "decoder_sparse_step": 1}, None), ({"num_experts": 0}, 6144)])
def test_qwen_moe_dense_layers_follow_the_sparse_step_and_mlp_only_layers(tmp_path, layout,
                                                                         dense):
    raw = {"model_type": "qwen3_moe", "num_experts_per_tok": 8, **layout}
    model = load_model(_write(tmp_path / "config.json", raw))
    assert model.intermediate_size == dense
    assert (model.num_experts is None) == (layout.get("num_experts") == 0)


def test_head_dim_derived_and_kv_heads_default_to_q_heads(tmp_path):
    raw = {"model_type": "llama", "hidden_size": 3072, "num_attention_heads": 48}
    model = load_model(_write(tmp_path / "config.json", raw))
    assert model.head_dim == 64
    assert model.num_kv_heads == 48
    assert model.rms_norm_eps == 1e-6  # LlamaConfig's default
    assert not model.qk_norm


@pytest.mark.parametrize(("raw", "name"), [
    ({**QWEN3_8B_HF, "_name_or_path": "Qwen/Qwen3-8B"}, "Qwen/Qwen3-8B"),
    (QWEN3_8B_HF, "my-model"),
])
def test_a_config_file_is_named_after_name_or_path_else_its_stem(tmp_path, raw, name):
    (tmp_path / "configs").mkdir()
    assert load_model(_write(tmp_path / "configs" / "my-model.json", raw)).name == name


def test_a_config_json_is_named_after_its_folder(tmp_path):
    (tmp_path / "Qwen3-8B").mkdir()
    assert load_model(_write(tmp_path / "Qwen3-8B" / "config.json", QWEN3_8B_HF)).name == (
        "Qwen3-8B")


def test_invalid_json_is_a_clear_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    with pytest.raises(UnknownModelError, match="is not valid JSON"):
        load_model(str(path))


def test_a_missing_field_takes_the_config_class_default(tmp_path):
    path = _write(tmp_path / "config.json", {"model_type": "qwen3", "num_attention_heads": 32})
    assert load_model(path).hidden_size == 4096  # Qwen3Config's default


def test_directory_without_config_json_is_unknown(tmp_path):
    with pytest.raises(UnknownModelError, match="unknown model"):
        load_model(str(tmp_path))


def test_config_that_is_not_an_object_is_a_clear_error(tmp_path):
    path = _write(tmp_path / "config.json", [1, 2])
    with pytest.raises(UnknownModelError, match="expected a JSON object, found list"):
        load_model(path)


def test_gemma3_normalises_q_and_k_with_weight_plus_one(tmp_path):
    path = _write(tmp_path / "config.json", {
        "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "rms_norm_eps": 1e-6},
    })
    model = load_model(path)
    assert model.qk_norm and model.norm_weight_bias == 1.0 and model.head_dim == 256
    assert PRESETS["qwen3-8b"].norm_weight_bias == 0.0


def test_mla_low_rank_widths_become_extra_norm_widths(tmp_path):
    raw = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 256,
           "num_experts_per_tok": 8}
    model = load_model(_write(tmp_path / "config.json", raw))
    assert model.extra_norm_widths == (1536, 512)
    no_q_rank = load_model(_write(tmp_path / "config.json", {**raw, "q_lora_rank": None}))
    assert no_q_rank.extra_norm_widths == (512,)  # DeepSeek-V2-Lite: q is not low-rank
    assert PRESETS["deepseek-v3"].extra_norm_widths == (1536, 512)
    assert PRESETS["qwen3-8b"].extra_norm_widths == ()


@pytest.mark.parametrize(("model_type", "key", "value"), [
    ("qwen3", "hidden_act", "gelu"), ("gemma3_text", "hidden_activation", "gelu"),
    ("gemma3_text", "hidden_act", "gelu_pytorch_tanh")])
def test_the_mlp_activation_is_read_from_the_familys_key(tmp_path, model_type, key, value):
    """Gemma 3's MLP takes hidden_activation; a hidden_act beside it is not what it runs."""
    raw = {"model_type": model_type, key: value}
    act = load_model(_write(tmp_path / "config.json", raw)).hidden_act
    assert act == (value if key != "hidden_act" or model_type == "qwen3"
                   else "gelu_pytorch_tanh")
    assert PRESETS["qwen3-8b"].hidden_act == "silu"


@pytest.mark.parametrize(("raw", "field", "expected"), MALFORMED)
def test_every_malformed_field_is_one_line_naming_the_file_and_the_field(tmp_path, raw, field,
                                                                       expected):
    path = _write(tmp_path / "config.json", raw)
    with pytest.raises(UnknownModelError) as info:
        load_model(path)
    message = str(info.value)
    assert message.startswith(f"config {path}: {field} is ") and message.endswith(expected)
    assert "\n" not in message


@pytest.mark.parametrize("field", sorted(set(BASE_OF_FIELD) - {"model_type"} - NULL_MEANS_NONE))
def test_a_null_field_reads_as_missing(tmp_path, field):
    raw = BASE_OF_FIELD[field]
    missing = load_model(_write(tmp_path / "config.json",
                                {k: v for k, v in raw.items() if k != field}))
    assert load_model(_write(tmp_path / "config.json", {**raw, field: None})) == missing


@pytest.mark.parametrize(("make", "fragment"), BAD_MODEL_PATHS)
def test_a_bad_model_path_is_one_line(tmp_path, monkeypatch, make, fragment):
    with pytest.raises(UnknownModelError, match=fragment) as info:
        load_model(make(tmp_path, monkeypatch))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok is 9, more than its 8"),
    ({"text_config": "qwen3"}, "text_config is 'qwen3'; expected an object"),
    ({"mlp_layer_types": ["dense"]}, "mlp_layer_types is \\['dense'\\]; expected a list of 47"),
])
def test_inconsistent_configs_are_one_line(tmp_path, changes, message):
    base = {"model_type": "glm4_moe_lite" if "mlp_layer_types" in changes else "qwen3_moe"}
    with pytest.raises(UnknownModelError, match=message):
        load_model(_write(tmp_path / "config.json", {**base, **changes}))


def test_a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(UnknownModelError, match=f"{path} is not valid JSON"):
        load_model(str(tmp_path))


def test_gpt_oss_clamped_swiglu_is_not_read_as_silu(tmp_path):
    raw = {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
           "num_local_experts": 32, "num_experts_per_tok": 4, "hidden_act": "silu",
           "swiglu_limit": 7.0, "rms_norm_eps": 1e-5}
    assert load_model(_write(tmp_path / "config.json", raw)).hidden_act == CLAMPED_SWIGLU
