"""cutetune reads the rotary embedding of every committed config as transformers does: the
thetas, the share of a head rotated and the scaling's type, against the rope_parameters of
transformers' own config class built from the same config.json."""

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from cutetune.spaces.hf_config import FAMILY_OF_TYPE, LayerRope  # noqa: E402
from cutetune.spaces.models import PRESETS_DIR, model_from_hf_config  # noqa: E402

CONFIG_FILES = (sorted(PRESETS_DIR.glob("*.json"))
                + sorted((Path(__file__).parents[1] / "data" / "hf_configs").glob("*.json")))
# Kimi-K2's auto_map names DeepSeek-V3's configuration code.
CLASS_OF_TYPE = {"kimi_k2": "deepseek_v3"}
# Qwen3's long-context setting, as its model cards give it.
QWEN3_YARN = {**json.loads((PRESETS_DIR / "qwen3-8b.json").read_text()),
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32768}}
GEMMA3 = json.loads((Path(__file__).parents[1] / "data" / "hf_configs"
                     / "gemma-3-1b-it.json").read_text())
# Gemma 3 4B to 27B scale the full-attention layers' frequencies, not the sliding ones'.
GEMMA3_LINEAR = {**GEMMA3, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}


def _as_transformers_5_writes(raw: dict) -> dict:
    """The config.json transformers 5 writes of `raw`: Gemma 3's rope parameters one set per
    kind of attention layer."""
    return CONFIG_MAPPING[raw["model_type"]](**raw).to_dict()


def _rope_parameters(raw: dict) -> list[dict]:
    """transformers' rope parameters of each kind of attention layer."""
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    model_type = raw.get("model_type")
    config = CONFIG_MAPPING[CLASS_OF_TYPE.get(model_type, model_type)](**raw).get_text_config()
    parameters = config.rope_parameters
    return list(parameters.values()) if "rope_type" not in parameters else [parameters]


def _rotation(parameters: dict) -> tuple[float, str | None]:
    """(theta, the scaling's type as cutetune names it) of a kind's rope parameters."""
    kind = "mrope" if "mrope_section" in parameters else parameters["rope_type"]
    return float(parameters["rope_theta"]), None if kind == "default" else kind


@pytest.mark.parametrize("raw", [
    *[pytest.param(json.loads(path.read_text()), id=path.stem) for path in CONFIG_FILES],
    pytest.param(QWEN3_YARN, id="qwen3-8b-yarn"),
    # transformers takes the pretraining context from max_position_embeddings.
    pytest.param({**QWEN3_YARN, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
                 id="qwen3-8b-yarn-unstated-context"),
    # ... and not from beside the parameters.
    pytest.param({**QWEN3_YARN, "original_max_position_embeddings": 8192},
                 id="qwen3-8b-yarn-context-beside"),
    pytest.param(GEMMA3_LINEAR, id="gemma-3-linear"),
    pytest.param(_as_transformers_5_writes(GEMMA3), id="gemma-3-1b-per-layer-kind"),
    pytest.param(_as_transformers_5_writes(GEMMA3_LINEAR), id="gemma-3-linear-per-layer-kind"),
    *[pytest.param({"model_type": t}, id=f"bare-{t}") for t in sorted(FAMILY_OF_TYPE)],
])
def test_rope_reading_matches_transformers(raw):
    ours = model_from_hf_config(raw, name="m")
    layers = _rope_parameters(raw)
    factors = {p.get("partial_rotary_factor", 1.0) for p in layers}
    assert factors == {ours.partial_rotary_factor}
    if not ours.ropes:
        # A config that states no theta takes its class's rope (gpt-oss's is YaRN): not read
        # yet where its Family states no default, so rope's problems_for_model refuses such a
        # model.
        return
    # Each kind of layer's rotation, and each of its numbers, is one of ours.
    theirs = {_rotation(p): p for p in layers}
    assert {(rope.theta, rope.scaling) for rope in ours.ropes} == set(theirs)
    for rope in ours.ropes:
        for key, value in rope.scaling_parameters:
            assert value == float(theirs[rope.theta, rope.scaling][key]), key


@pytest.mark.parametrize(("name", "rotary_dim"), [("GLM-4.5", 64),
                                                  ("Qwen3-Next-80B-A3B-Instruct", 64),
                                                  ("Qwen2.5-7B-Instruct", 128)])
def test_rotary_dim_is_the_rotated_share_of_a_head(name, rotary_dim):
    path = Path(__file__).parents[1] / "data" / "hf_configs" / f"{name}.json"
    assert model_from_hf_config(json.loads(path.read_text()), name=name).rotary_dim == rotary_dim


@pytest.mark.parametrize("raw", [GEMMA3, GEMMA3_LINEAR], ids=["1b", "linear"])
def test_gemma3_reads_alike_in_both_forms(raw):
    """transformers 5 writes Gemma 3's rope parameters per kind of attention layer: both
    kinds' rotations, the full-attention layers' scaling only theirs, are read from that form
    as from the first."""
    first = model_from_hf_config(raw, name="m")
    per_kind = model_from_hf_config(_as_transformers_5_writes(raw), name="m")
    assert first.ropes == per_kind.ropes
    sliding, full = first.ropes
    assert sliding == LayerRope(1e4)
    assert full == (LayerRope(1e6, "linear", (("factor", 8.0),)) if raw is GEMMA3_LINEAR
                    else LayerRope(1e6))
