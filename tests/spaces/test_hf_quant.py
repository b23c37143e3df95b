"""A model's activation quantisation, read from config.json's quantization_config: committed
public snippets of each writer (fp8 block, compressed-tensors, modelopt), the presets, the
readings of transformers' own quantization config classes where it has them, and one line for
a malformed field of a method cutetune reads."""

import json
from pathlib import Path

import pytest

from cutetune.spaces.hf_config import UnknownModelError
from cutetune.spaces.hf_quant import ActivationQuant
from cutetune.spaces.models import PRESETS, load_model, model_from_hf_config

DATA = Path(__file__).parents[1] / "data"
SNIPPETS = json.loads((DATA / "hf_quant_configs.json").read_text())
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}


def _read(quant: dict, **outer) -> ActivationQuant | None:
    return model_from_hf_config({**LLAMA, "quantization_config": quant, **outer},
                                name="m").activation_quant


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_committed_snippets_read_as_expected(name):
    snippet = SNIPPETS[name]
    expected = snippet["expected"]
    got = _read(snippet["quantization_config"])
    assert got == (None if expected is None else ActivationQuant(*expected))


def test_a_multimodal_config_states_it_beside_or_inside_its_text_config():
    quant = SNIPPETS["deepseek-ai/DeepSeek-V3"]["quantization_config"]
    text = {**LLAMA, "model_type": "qwen3_vl_text"}
    inside = {"model_type": "qwen3_vl", "text_config": {**text, "quantization_config": quant}}
    beside = {"model_type": "qwen3_vl", "text_config": text, "quantization_config": quant}
    for raw in (inside, beside):
        assert model_from_hf_config(raw, name="m").activation_quant == ActivationQuant(
            "fp8_group", 128)


def test_presets_deepseek_v3_fp8_groups_and_llama_nvfp4():
    assert PRESETS["deepseek-v3"].activation_quant == ActivationQuant("fp8_group", 128, "fp32")
    assert PRESETS["llama-3.1-8b-fp4"].activation_quant == ActivationQuant("nvfp4", 16, "e4m3")
    assert PRESETS["qwen3-8b"].activation_quant is None
    # The FP4 preset is the BF16 model's shape: only the quantisation differs.
    fp4 = PRESETS["llama-3.1-8b-fp4"]
    bf16 = PRESETS["llama-3.1-8b"]
    assert (fp4.hidden_size, fp4.intermediate_size, fp4.head_dim) == (
        bf16.hidden_size, bf16.intermediate_size, bf16.head_dim)


def test_kimi_k2_reads_deepseek_fp8_groups():
    model = load_model(str(DATA / "hf_configs" / "Kimi-K2-Instruct.json"))
    assert model.activation_quant == ActivationQuant("fp8_group", 128)


@pytest.mark.parametrize("quant", [
    {"quant_method": "awq", "bits": 4, "group_size": 128},
    {"quant_method": "some-future-method", "anything": [1, 2]},
    {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "group_size": 16},
    {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
    {"no_method": True},
], ids=["awq", "unknown", "weight-only-nvfp4", "mixed", "no-method"])
def test_weight_only_or_unknown_methods_read_as_none(quant):
    assert _read(quant) is None


def test_a_mixed_compressed_tensors_recipe_is_not_one_format():
    groups = {f"group_{i}": {"input_activations": {"num_bits": 8, "type": "float",
                                                   "strategy": "group", "group_size": size},
                             "targets": ["Linear"]} for i, size in enumerate((64, 128))}
    assert _read({"quant_method": "compressed-tensors", "config_groups": groups}) is None


@pytest.mark.parametrize("quant, field, expected", [
    ("fp8", "quantization_config", "expected an object"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config."
     "weight_block_size", "expected two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [128, 0]}, "weight_block_size",
     "expected two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "e5m2"},
     "scale_fmt", 'expected "float" or "ue8m0"'),
    ({"quant_method": "compressed-tensors", "config_groups": ["group_0"]}, "config_groups",
     "expected an object"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"input_activations": {
        "num_bits": 8, "type": "float", "strategy": "group"}}}},
     "config_groups.g.input_activations.group_size", 'for strategy "group"'),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"input_activations": {
        "num_bits": "8", "type": "float"}}}}, "num_bits", "expected a positive integer"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size",
     "expected 16 for NVFP4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": {"g": {
        "input_activations": {"group_size": 32}}}},
     "config_groups.g.input_activations.group_size is 32", "expected 16 for NVFP4"),
    ({"quant_method": "modelopt", "quant_algo": 4}, "quant_algo", "expected a string"),
])
def test_a_malformed_field_is_one_line_naming_it(quant, field, expected):
    with pytest.raises(UnknownModelError) as info:
        _read(quant)
    message = str(info.value)
    assert "\n" not in message and message.startswith("config m: ")
    assert field in message and expected in message


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", [n for n in sorted(SNIPPETS)
                                  if SNIPPETS[n]["quantization_config"]["quant_method"] == "fp8"])
def test_fp8_reading_matches_transformers_fine_grained_fp8_config(name):
    """transformers' FineGrainedFP8Config (the class config.json's "fp8" builds) quantises
    activations dynamically in groups of weight_block_size[1], with scale_fmt's scales."""
    from transformers.quantizers.auto import AutoQuantizationConfig

    raw = SNIPPETS[name]["quantization_config"]
    config = AutoQuantizationConfig.from_dict(dict(raw))
    ours = _read(raw)
    assert type(config).__name__ == "FineGrainedFP8Config"
    assert config.activation_scheme == "dynamic"
    assert ours.group_size == config.weight_block_size[1]
    assert ours.scale_format == ("ue8m0" if config.scale_fmt == "ue8m0" else "fp32")


# The KV cache's element type, where the checkpoint states one: modelopt's kv_cache_quant_algo
# (as its exporter writes it, "FP8" beside quant_algo), compressed-tensors' kv_cache_scheme (as
# llm-compressor writes it: 8-bit float, one scale per tensor).
MODELOPT_FP8_KV = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
CT_FP8_KV = {"quant_method": "compressed-tensors", "config_groups": {},
             "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                 "dynamic": False, "symmetric": True}}


def _kv(quant: dict | None, **outer):
    raw = {**LLAMA, **outer} if quant is None else {**LLAMA, "quantization_config": quant,
                                                     **outer}
    return model_from_hf_config(raw, name="m").kv_cache_dtype


@pytest.mark.parametrize("quant, expected", [
    (MODELOPT_FP8_KV, "float8_e4m3fn"),
    ({**MODELOPT_FP8_KV, "kv_cache_quant_algo": "NVFP4"}, "nvfp4"),
    ({**MODELOPT_FP8_KV, "kv_cache_quant_algo": None}, None),
    (CT_FP8_KV, "float8_e4m3fn"),
    ({**CT_FP8_KV, "kv_cache_scheme": {"num_bits": 8, "type": "int"}}, "int8"),
    (SNIPPETS["deepseek-ai/DeepSeek-V3"]["quantization_config"], None),
    (None, None),
])
def test_the_kv_cache_dtype_a_checkpoint_states(quant, expected):
    assert _kv(quant) == expected


def test_a_kv_cache_dtype_inside_text_config_is_read():
    text = {**LLAMA, "model_type": "qwen3_vl_text", "quantization_config": MODELOPT_FP8_KV}
    assert model_from_hf_config({"model_type": "qwen3_vl", "text_config": text},
                                name="m").kv_cache_dtype == "float8_e4m3fn"


@pytest.mark.parametrize("quant, message", [
    ({**MODELOPT_FP8_KV, "kv_cache_quant_algo": "FP16"},
     "quantization_config.kv_cache_quant_algo is 'FP16'; expected one of fp8, int8, nvfp4"),
    ({**CT_FP8_KV, "kv_cache_scheme": {"num_bits": 4, "type": "float"}},
     "quantization_config.kv_cache_scheme.num_bits is 4; expected 8, of type float or int"),
])
def test_a_kv_cache_dtype_cutetune_cannot_read_is_one_line(quant, message):
    with pytest.raises(UnknownModelError, match=message):
        _kv(quant)
