"""Malformed values for every config.json field the model reader takes, shared by the reader's
tests and the CLI's: (field, value, the end of the one-line message that refuses it)."""

POSITIVE_INTEGER_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads",
                           "head_dim", "intermediate_size", "moe_intermediate_size",
                           "num_experts", "n_routed_experts", "num_local_experts",
                           "num_experts_per_tok", "q_lora_rank", "kv_lora_rank")
MALFORMED = (
    [(field, value, "expected a positive integer") for field in POSITIVE_INTEGER_FIELDS
     for value in ("abc", "4096", 0, -4, 2.5, True, [4096], {"x": 1})]
    + [(field, value, "expected a positive number") for field in ("rms_norm_eps", "swiglu_limit")
       for value in ("tiny", 0, -1e-6, float("inf"), False, [1e-6])]
    + [(field, value, "expected a string") for field in ("model_type", "hidden_act",
                                                         "hidden_activation")
       for value in (3, ["silu"], {"a": 1})]
    + [("use_qk_norm", value, "expected true or false") for value in ("yes", 1)]
)


