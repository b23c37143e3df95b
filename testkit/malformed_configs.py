"""Malformed values for every config.json field the model reader takes, each in a config of a
family that reads that field, shared by the reader's tests and the CLI's:
(config with the bad value, field, the end of the one-line message that refuses it).

Bad --model paths beside them: (what to write, the spelling of --model, a fragment of the line).
"""

import json
from pathlib import Path

QWEN3 = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
         "rms_norm_eps": 1e-6}
QWEN3_MOE = {**QWEN3, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 768, "mlp_only_layers": [0]}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 2048, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "q_lora_rank": 512, "kv_lora_rank": 256,
               "first_k_dense_replace": 1, "n_shared_experts": 1}

# The family whose config reads each field.
BASE_OF_FIELD = {
    **dict.fromkeys(("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "rms_norm_eps", "hidden_act", "model_type"), QWEN3),
    **dict.fromkeys(("moe_intermediate_size", "num_experts", "num_experts_per_tok",
                     "decoder_sparse_step", "mlp_only_layers"), QWEN3_MOE),
    **dict.fromkeys(("n_routed_experts", "q_lora_rank", "kv_lora_rank",
                     "first_k_dense_replace", "n_shared_experts"), DEEPSEEK_V3),
    "num_local_experts": {**QWEN3, "model_type": "mixtral", "num_local_experts": 8,
                          "num_experts_per_tok": 2},
    "hidden_activation": {**QWEN3, "model_type": "gemma3_text"},
    "use_qk_norm": {**QWEN3, "model_type": "glm4_moe", "n_routed_experts": 8,
                    "num_experts_per_tok": 2},
    "shared_expert_intermediate_size": {**QWEN3_MOE, "model_type": "qwen3_next"},
}

POSITIVE_INTEGER_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads",
                           "head_dim", "intermediate_size", "moe_intermediate_size",
                           "n_routed_experts", "num_local_experts", "num_experts_per_tok",
                           "q_lora_rank", "kv_lora_rank", "decoder_sparse_step",
                           "shared_expert_intermediate_size")
# Fields where 0 means none (no experts, no dense layer first, no shared expert).
NON_NEGATIVE_INTEGER_FIELDS = ("num_experts", "first_k_dense_replace", "n_shared_experts")
_NOT_INTEGERS = ("abc", "4096", -4, 2.5, True, [4096], {"x": 1})

_MALFORMED_VALUES = (
    [(field, value, "expected a positive integer") for field in POSITIVE_INTEGER_FIELDS
     for value in (0, *_NOT_INTEGERS)]
    + [(field, value, "expected a non-negative integer") for field in NON_NEGATIVE_INTEGER_FIELDS
       for value in _NOT_INTEGERS]
    + [("rms_norm_eps", value, "expected a positive number")
       for value in ("tiny", 0, -1e-6, float("inf"), False, [1e-6])]
    + [(field, value, "expected a string") for field in ("model_type", "hidden_act",
                                                         "hidden_activation")
       for value in (3, ["silu"], {"a": 1})]
    + [("use_qk_norm", value, "expected true or false") for value in ("yes", 1)]
    + [("mlp_only_layers", value, "expected a list of layer numbers")
       for value in (3, ["0"], [-1], [True])]
)
MALFORMED = [({**BASE_OF_FIELD[field], field: value}, field, expected)
             for field, value, expected in _MALFORMED_VALUES]


def deeply_nested(tmp_path, monkeypatch) -> str:
    """A JSON file nested deeper than Python's parser recurses."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return str(path)


def unreadable_folder(tmp_path, monkeypatch) -> str:
    """A model folder the user may not enter. The tests run as root, whom no permission stops,
    so the folder's stat fails as it does for another user."""
    path = tmp_path / "locked"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(QWEN3))
    is_dir = Path.is_dir

    def denied(self):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return is_dir(self)

    monkeypatch.setattr(Path, "is_dir", denied)
    return str(path)


# (make the path, a fragment of the one line that refuses it)
BAD_MODEL_PATHS = [(deeply_nested, "nests its JSON too deeply"),
                   (unreadable_folder, "cannot read")]
