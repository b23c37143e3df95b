"""cutetune reads the vocabulary size of every committed config (and each family's bare config,
which takes its class's default) as transformers' own config class does: the rows of the token
embedding that the embedding kernel gathers from."""

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from cutetune.spaces.hf_config import FAMILY_OF_TYPE, UnknownModelError  # noqa: E402
from cutetune.spaces.models import PRESETS_DIR, model_from_hf_config  # noqa: E402

CONFIG_FILES = (sorted(PRESETS_DIR.glob("*.json"))
                + sorted((Path(__file__).parents[1] / "data" / "hf_configs").glob("*.json")))
# Kimi-K2's auto_map names DeepSeek-V3's configuration code.
CLASS_OF_TYPE = {"kimi_k2": "deepseek_v3"}


@pytest.mark.parametrize("raw", [
    *[pytest.param(json.loads(path.read_text()), id=path.stem) for path in CONFIG_FILES],
    *[pytest.param({"model_type": t}, id=f"bare-{t}") for t in sorted(FAMILY_OF_TYPE)],
])
def test_vocab_size_matches_transformers(raw):
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    model_type = raw.get("model_type")
    config = CONFIG_MAPPING[CLASS_OF_TYPE.get(model_type, model_type)](**raw).get_text_config()
    assert model_from_hf_config(raw, name="m").vocab_size == config.vocab_size


def test_a_nested_text_config_states_the_vocabulary():
    """Qwen3-VL states vocab_size in its text_config only."""
    path = Path(__file__).parents[1] / "data" / "hf_configs" / "Qwen3-VL-235B-A22B-Instruct.json"
    assert "vocab_size" not in json.loads(path.read_text())
    assert model_from_hf_config(json.loads(path.read_text()), name="m").vocab_size == 151936


def test_a_vocab_size_that_is_no_positive_integer_is_refused():
    with pytest.raises(UnknownModelError, match="vocab_size is 0; expected a positive integer"):
        model_from_hf_config({"model_type": "qwen3", "vocab_size": 0}, name="m")
