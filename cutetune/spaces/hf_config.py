"""Hugging Face configs read as transformers reads them.

Each model_type cutetune accepts has a Family: the defaults its transformers config class gives
the fields cutetune reads (a field missing from config.json takes that default, as it does in
transformers), the names transformers maps onto them, and what its modeling code builds from
them: the RMSNorm's weight offset, whether q and k are normalised per head, which decoder layers
run a dense MLP and which the routed experts, the shared experts' width, the MLA low-rank norms.
tests/spaces/test_hf_families.py builds transformers' own config classes and modules from the
committed configs and checks every reading here against them. A model_type without a Family is
refused by name: a norm or MLP cutetune cannot express is never approximated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


class UnknownModelError(ValueError):
    pass


@dataclass(frozen=True)
class LayerRope:
    """The rotary embedding of a kind of attention layer as config.json states it: its theta,
    the frequency scaling's type (rope_type; "mrope" for multimodal RoPE), None for plain
    theta, and the scaling's numbers by name (factor, low_freq_factor,
    original_max_position_embeddings, ...; YaRN's truncate as 1.0 or 0.0)."""

    theta: float
    scaling: str | None = None
    scaling_parameters: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class MlaShape:
    """MLA attention's heads (DeepSeek-V3, Kimi-K2, GLM-4.7-Flash): each of q_heads query heads
    is nope_head_dim elements that do not rotate, then rope_head_dim that do; k's rotated part
    is one head of rope_head_dim that every head shares (the tail of the kv_a projection);
    values are value_head_dim wide. Rotated pairs are interleaved (GPT-J style) where
    `interleaved` (transformers' rope_interleave), else halves."""

    q_heads: int
    nope_head_dim: int
    rope_head_dim: int
    value_head_dim: int
    interleaved: bool


# gpt-oss's MLP clamps gate and up at `swiglu_limit`, takes gate * sigmoid(1.702 gate) times
# (up + 1), with gate and up interleaved: not SiLU, though its config names hidden_act "silu".
CLAMPED_SWIGLU = "swiglu_oai"

# Which decoder layers route to experts (every other layer runs the dense MLP):
#   dense          none
#   experts        all of them
#   sparse_step    layer i unless i is in mlp_only_layers, and only where (i + 1) is a multiple
#                  of decoder_sparse_step (the Qwen MoE families)
#   first_k_dense  layer i from first_k_dense_replace on (DeepSeek-V3, GLM-4.5)
#   layer_types    where mlp_layer_types[i] is "sparse" (GLM-4.7-Flash)
MlpLayout = Literal["dense", "experts", "sparse_step", "first_k_dense", "layer_types"]
# The shared experts beside the routed ones: none, one MLP of shared_expert_intermediate_size
# (Qwen), or n_shared_experts MLPs fused into one of n_shared_experts * moe_intermediate_size
# (DeepSeek, GLM).
SharedExperts = Literal["none", "width", "count"]


@dataclass(frozen=True)
class Family:
    """How transformers reads and builds one family of models."""

    # The text model's model_type first; multimodal wrappers whose text_config it reads after.
    model_types: tuple[str, ...]
    # The config class's default of each field cutetune reads; None where transformers derives
    # it (head_dim from hidden_size / heads, num_key_value_heads from the heads).
    defaults: Mapping[str, Any]
    # transformers' attribute_map: a name config.json may use -> the field it sets.
    aliases: Mapping[str, str] = field(default_factory=dict)
    # Gemma-style norms scale by (1 + w).
    norm_weight_bias: float = 0.0
    # Gemma multiplies the token embedding by sqrt(hidden_size) (its ScaledWordEmbedding).
    scaled_embedding: bool = False
    # "per_head": q_norm and k_norm over head_dim; "flag": so where use_qk_norm is true.
    qk_norm: Literal["none", "per_head", "flag"] = "none"
    mlp: MlpLayout = "dense"
    # The routed experts' width: moe_intermediate_size, or intermediate_size where every layer
    # routes (Mixtral, gpt-oss).
    expert_width_field: str = "moe_intermediate_size"
    experts_field: str = "num_experts"
    shared_experts: SharedExperts = "none"
    # MLA attention (q_lora_rank, kv_lora_rank): its low-rank norms are built without the
    # config's eps, so they take their class's default.
    mla_norm_eps: float | None = None
    activation_field: str = "hidden_act"
    # An MLP whose activation is not the one its config names (gpt-oss's clamped SwiGLU).
    fixed_activation: str | None = None
    # The config class's partial_rotary_factor: the share of a head that rotary embedding
    # rotates where config.json does not say.
    partial_rotary_factor: float = 1.0


_DENSE = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "hidden_size": 4096, "vocab_size": 32000}
_QWEN = {**_DENSE, "vocab_size": 151936}

_GEMMA = {**{k: v for k, v in _DENSE.items() if k != "hidden_act"}, "hidden_size": 2304,
          "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 256, "intermediate_size": 9216, "hidden_activation": "gelu_pytorch_tanh",
          "vocab_size": 256000}

FAMILIES: tuple[Family, ...] = (
    Family(("llama",), {**_DENSE, "num_key_value_heads": None, "head_dim": None,
                        "intermediate_size": 11008}),
    Family(("mistral",), {**_DENSE, "num_key_value_heads": 8, "head_dim": None,
                          "intermediate_size": 14336}),
    Family(("qwen2",), {**_QWEN, "num_key_value_heads": 32, "head_dim": None,
                        "intermediate_size": 22016}),
    Family(("qwen3",), {**_QWEN, "num_key_value_heads": 32, "head_dim": 128,
                        "intermediate_size": 22016}, qk_norm="per_head"),
    Family(("qwen3_vl_text", "qwen3_vl"),
           {**_QWEN, "num_key_value_heads": 32, "head_dim": 128, "intermediate_size": 22016},
           qk_norm="per_head"),
    Family(("qwen3_moe",),
           {**_QWEN, "hidden_size": 2048, "num_hidden_layers": 24, "num_key_value_heads": 4,
            "head_dim": None, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
            "mlp_only_layers": []},
           aliases={"num_local_experts": "num_experts"}, qk_norm="per_head", mlp="sparse_step"),
    Family(("qwen3_vl_moe_text", "qwen3_vl_moe"),
           {**_QWEN, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
            "num_key_value_heads": 16, "head_dim": None, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "num_experts": 60, "num_experts_per_tok": 4,
            "decoder_sparse_step": 1, "mlp_only_layers": []},
           aliases={"num_local_experts": "num_experts"}, qk_norm="per_head", mlp="sparse_step"),
    # Qwen3-Next's norms scale by (1 + w), its weights initialised to zeros. Its linear-attention
    # layers' gated norm is another kernel, which cutetune does not serve.
    Family(("qwen3_next",),
           {**_QWEN, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5632,
            "moe_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
            "decoder_sparse_step": 1, "mlp_only_layers": [],
            "shared_expert_intermediate_size": 512},
           norm_weight_bias=1.0, qk_norm="per_head", mlp="sparse_step", shared_experts="width",
           partial_rotary_factor=0.25),
    Family(("mixtral",),
           {**_DENSE, "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "head_dim": None,
            "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2},
           aliases={"num_experts": "num_local_experts"}, mlp="experts",
           expert_width_field="intermediate_size", experts_field="num_local_experts"),
    Family(("gpt_oss",),
           {**_DENSE, "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
            "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
            "vocab_size": 201088},
           aliases={"num_experts": "num_local_experts"}, mlp="experts",
           expert_width_field="intermediate_size", experts_field="num_local_experts",
           fixed_activation=CLAMPED_SWIGLU),
    # Kimi-K2's config names DeepSeek-V3's code (auto_map) under a model_type of its own.
    Family(("deepseek_v3", "kimi_k2"),
           {**_DENSE, "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
            "num_key_value_heads": None, "head_dim": None, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
            "first_k_dense_replace": 3, "n_shared_experts": 1, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "rope_interleave": True, "vocab_size": 129280},
           aliases={"num_local_experts": "n_routed_experts"}, mlp="first_k_dense",
           experts_field="n_routed_experts", shared_experts="count", mla_norm_eps=1e-6),
    Family(("glm4_moe",),
           {**_DENSE, "num_hidden_layers": 46, "num_attention_heads": 96,
            "num_key_value_heads": 8, "head_dim": None, "rms_norm_eps": 1e-5,
            "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 128,
            "num_experts_per_tok": 8, "first_k_dense_replace": 1, "n_shared_experts": 1,
            "use_qk_norm": False, "vocab_size": 151552},
           aliases={"num_local_experts": "n_routed_experts"}, qk_norm="flag",
           mlp="first_k_dense", experts_field="n_routed_experts", shared_experts="count",
           partial_rotary_factor=0.5),
    Family(("glm4_moe_lite",),
           {**_DENSE, "hidden_size": 2048, "num_hidden_layers": 47, "num_attention_heads": 20,
            "num_key_value_heads": 20, "head_dim": None, "rms_norm_eps": 1e-5,
            "intermediate_size": 10240, "moe_intermediate_size": 1536, "n_routed_experts": 64,
            "num_experts_per_tok": 4, "n_shared_experts": 1, "q_lora_rank": 768,
            "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
            "v_head_dim": 256, "rope_interleave": True, "mlp_layer_types": None,
            "vocab_size": 154880},
           aliases={"num_local_experts": "n_routed_experts"}, mlp="layer_types",
           experts_field="n_routed_experts", shared_experts="count", mla_norm_eps=1e-6),
    # Gemma's norms scale by (1 + w); its MLP's activation is hidden_activation. Gemma 3
    # normalises q and k per head, Gemma 2 does not.
    Family(("gemma2",), _GEMMA, norm_weight_bias=1.0, activation_field="hidden_activation",
           scaled_embedding=True),
    # Gemma 3's sliding-window layers rotate with rope_local_base_freq, its others with
    # rope_theta (scaled linearly from 4B up: their configs state the scaling, not the thetas).
    Family(("gemma3_text", "gemma3"), {**_GEMMA, "vocab_size": 262208, "rope_theta": 1e6,
                                       "rope_local_base_freq": 1e4}, norm_weight_bias=1.0,
           qk_norm="per_head", activation_field="hidden_activation", scaled_embedding=True),
)

FAMILY_OF_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}

# Families cutetune knows and cannot serve, with the reason.
REFUSED_TYPES = {
    "llama4": "Llama 4 normalises q and k with an L2 norm without a weight",
    "llama4_text": "Llama 4 normalises q and k with an L2 norm without a weight",
    "olmo2": "OLMo 2 normalises the whole q and k projections, not each head",
    "minimax_m2": "MiniMax-M2 normalises the whole q and k projections, not each head",
}


def shape_fields(raw: Any, where: str) -> dict[str, Any]:
    """The ModelShape fields (all but its name) of a config.json's parsed JSON, as transformers
    reads the config and builds the model's modules; UnknownModelError, one line naming the
    config, the field, what it holds and what is accepted, for anything else."""
    if not isinstance(raw, dict):
        raise UnknownModelError(f"config {where}: expected a JSON object, found "
                                f"{type(raw).__name__}")
    outer_type = _Fields(raw, where, {}, {}).text("model_type")
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise UnknownModelError(f"config {where}: text_config is {text!r}; expected an object")
    model_type = (_Fields(text, where, {}, {}).text("model_type") if text else None) or outer_type
    family = FAMILY_OF_TYPE.get(model_type or "")
    if family is None:
        raise UnknownModelError(_unknown_type(where, model_type))
    cfg = _Fields(text if text is not None else raw, where, family.defaults, family.aliases)
    return _read(family, cfg, where)


def _unknown_type(where: str, model_type: str | None) -> str:
    accepted = ", ".join(sorted(FAMILY_OF_TYPE))
    if model_type in REFUSED_TYPES:
        return (f"config {where}: model_type {model_type!r} is not served: "
                f"{REFUSED_TYPES[model_type]}, which cutetune's kernels do not compute")
    what = f"model_type {model_type!r}" if model_type else "no model_type"
    return f"config {where}: {what}; cutetune reads the model types {accepted}"


def _read(family: Family, cfg: _Fields, where: str) -> dict[str, Any]:
    hidden = cfg.positive_int("hidden_size")
    q_heads = cfg.positive_int("num_attention_heads")
    layers = cfg.positive_int("num_hidden_layers")
    sparse = _sparse_layers(family, cfg, layers, where)
    experts = cfg.positive_int(family.experts_field) if any(sparse) else None
    top_k = cfg.positive_int("num_experts_per_tok") if experts else None
    if experts and not top_k:
        raise UnknownModelError(f"config {where}: it has {experts} routed experts but no "
                                "num_experts_per_tok; a MoE model needs both")
    if experts and top_k > experts:
        raise UnknownModelError(f"config {where}: num_experts_per_tok is {top_k}, more than "
                                f"its {experts} experts; expected 1 to {experts}")
    expert_width = cfg.positive_int(family.expert_width_field) if experts else None
    qk_norm = family.qk_norm == "per_head" or (family.qk_norm == "flag"
                                               and cfg.flag("use_qk_norm"))
    # MLA attends through low-rank projections: no per-head q and k for a norm to take.
    mla = family.mla_norm_eps is not None
    heads = (None, None, None) if mla else (
        q_heads, cfg.positive_int("num_key_value_heads") or q_heads,
        cfg.positive_int("head_dim") or hidden // q_heads)
    return dict(
        hidden_size=hidden,
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=heads[2],
        rms_norm_eps=cfg.positive_float("rms_norm_eps"),
        qk_norm=qk_norm,
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate=expert_width,
        intermediate_size=(cfg.positive_int("intermediate_size")
                           if not all(sparse) else None),
        shared_expert_intermediate=_shared_width(family, cfg) if experts else None,
        norm_weight_bias=family.norm_weight_bias,
        extra_norm_widths=tuple(width for key in ("q_lora_rank", "kv_lora_rank")
                                if mla and (width := cfg.positive_int(key))),
        extra_norm_eps=family.mla_norm_eps,
        mla=_mla(cfg, q_heads) if mla else None,
        hidden_act=_activation(family, cfg),
        vocab_size=cfg.positive_int("vocab_size"),
        embedding_scale=hidden**0.5 if family.scaled_embedding else 1.0,
        **_rope(family, cfg, where),
    )


def _mla(cfg: _Fields, q_heads: int) -> MlaShape:
    """An MLA model's heads as its config class reads them (a missing dim takes its
    default)."""
    dims = {key: cfg.positive_int(key) for key in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                   "v_head_dim")}
    for key, dim in dims.items():
        if dim is None:
            raise cfg._bad(key, "a positive integer")
    if dims["qk_rope_head_dim"] % 2:
        raise cfg._bad("qk_rope_head_dim", "an even number (rotated in pairs)")
    return MlaShape(q_heads=q_heads, nope_head_dim=dims["qk_nope_head_dim"],
                    rope_head_dim=dims["qk_rope_head_dim"], value_head_dim=dims["v_head_dim"],
                    interleaved=cfg.flag("rope_interleave"))


def _rope(family: Family, cfg: _Fields, where: str) -> dict[str, Any]:
    """The rotary embedding's fields as config.json states them, in the form transformers 4
    writes (rope_theta, rope_scaling, partial_rotary_factor at the top; Gemma 3's
    sliding-window layers rotate with rope_local_base_freq, unscaled) or 5 writes (all in
    rope_parameters, or one set of them per kind of attention layer where the kinds rotate
    differently: Gemma 3's {"sliding_attention": ..., "full_attention": ...}). One LayerRope
    per distinct rotation, by theta."""
    nested = cfg.value("rope_parameters")
    if nested is not None and not isinstance(nested, dict):
        raise cfg._bad("rope_parameters", "an object")
    top = cfg.value("rope_scaling")
    if top is not None and not isinstance(top, dict):
        raise cfg._bad("rope_scaling", "an object or null")
    per_kind = bool(nested) and all(isinstance(p, dict) for p in nested.values())
    kinds = list(nested.values()) if per_kind else [nested or {}]

    def stated(parameters: dict, key: str) -> float | None:
        return _Fields(parameters, where, {}, {}).positive_float(key) or cfg.positive_float(key)

    # (theta, what scales it) of each kind; the top-level rope_scaling is the scaling of a
    # model of one kind (or of the rope_theta layers beside rope_local_base_freq ones).
    rotations = [(stated(p, "rope_theta"), p if per_kind else top or p) for p in kinds]
    if nested is None and (local := cfg.positive_float("rope_local_base_freq")):
        rotations.append((local, {}))
    ropes = {_layer_rope(cfg, theta, scaling) for theta, scaling in rotations if theta}
    factor = stated(kinds[0], "partial_rotary_factor") or family.partial_rotary_factor
    return dict(ropes=tuple(sorted(ropes, key=lambda r: (r.theta, r.scaling or "",
                                                                r.scaling_parameters))),
                partial_rotary_factor=factor,
                mrope_section=next((section for _, scaling in rotations
                                    if (section := _mrope_section(cfg, scaling))), ()))


def _layer_rope(cfg: _Fields, theta: float, scaling: dict) -> LayerRope:
    """The rotation of theta and the rope parameters `scaling` (rope_type and its numbers)."""
    # Qwen3-VL's multimodal RoPE names the default type beside its mrope_section.
    kind = "mrope" if "mrope_section" in scaling else scaling.get("rope_type",
                                                                  scaling.get("type"))
    if kind in (None, "default"):
        return LayerRope(theta)
    # YaRN's truncate, a bool, reads as 1.0 or 0.0 beside the numbers.
    numbers = {key: float(value) for key, value in scaling.items()
               if isinstance(value, int | float)
               and key not in ("rope_theta", "partial_rotary_factor")}
    if (kind in ("llama3", "yarn", "longrope")
            and "original_max_position_embeddings" not in numbers
            and (context := cfg.positive_int("max_position_embeddings"))):
        # transformers takes the pretraining context, where the parameters leave it out, from
        # max_position_embeddings (one beside them is not read: the families' config classes
        # declare none, and set it after they standardise the parameters).
        numbers["original_max_position_embeddings"] = float(context)
    return LayerRope(theta, str(kind), tuple(sorted(numbers.items())))


def _mrope_section(cfg: _Fields, scaling: dict) -> tuple[int, ...]:
    """The pairs each of multimodal RoPE's three position streams rotates (temporal, height,
    width), as config.json states them; () without."""
    section = scaling.get("mrope_section")
    if section is None:
        return ()
    if (not isinstance(section, list) or len(section) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                       for n in section)):
        raise cfg._bad("rope_scaling.mrope_section", "a list of three counts of pairs")
    return tuple(section)


def _sparse_layers(family: Family, cfg: _Fields, layers: int, where: str) -> list[bool]:
    """Whether each decoder layer routes to experts, as the family's modeling code decides."""
    if family.mlp == "dense":
        return [False] * layers
    if family.mlp == "experts":
        return [True] * layers
    if family.mlp == "sparse_step":
        experts = cfg.non_negative_int(family.experts_field)
        step = cfg.positive_int("decoder_sparse_step")
        dense = set(cfg.int_list("mlp_only_layers"))
        return [i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers)]
    if family.mlp == "first_k_dense":
        first = cfg.non_negative_int("first_k_dense_replace")
        return [i >= first for i in range(layers)]
    types = cfg.value("mlp_layer_types")
    if types is None:
        return [i >= 1 for i in range(layers)]  # the config class's default: the first dense
    if (not isinstance(types, list) or len(types) != layers
            or any(t not in ("dense", "sparse") for t in types)):
        raise UnknownModelError(f"config {where}: mlp_layer_types is {types!r}; expected a list "
                                f"of {layers} (num_hidden_layers) \"dense\" or \"sparse\"")
    return [t == "sparse" for t in types]


def _shared_width(family: Family, cfg: _Fields) -> int | None:
    if family.shared_experts == "width":
        return cfg.positive_int("shared_expert_intermediate_size")
    if family.shared_experts == "count":
        count = cfg.non_negative_int("n_shared_experts")
        return count * cfg.positive_int(family.expert_width_field) if count else None
    return None


def _activation(family: Family, cfg: _Fields) -> str:
    return family.fixed_activation or cfg.text(family.activation_field)


# Fields whose null transformers keeps as "none" rather than as its default (a DeepSeek-V2-Lite
# q projection is not low-rank; a null rope_interleave rotates halves); any other null reads
# as the field missing.
NULL_MEANS_NONE = frozenset({"q_lora_rank", "rope_interleave"})


class _Fields:
    """Typed reads of a config's fields: a field of the wrong type or range is one line naming
    the config, the field, its value and what is accepted. A field missing (or null, but for
    NULL_MEANS_NONE) takes the family's default, as transformers' config class gives it."""

    def __init__(self, cfg: dict, where: str, defaults: Mapping[str, Any],
                 aliases: Mapping[str, str]):
        self.cfg = {aliases.get(key, key): value for key, value in cfg.items()}
        self.where = where
        self.defaults = defaults

    def value(self, key: str) -> Any:
        value = self.cfg.get(key)
        if value is None and not (key in self.cfg and key in NULL_MEANS_NONE):
            return self.defaults.get(key)
        return value

    def _bad(self, key: str, expected: str) -> UnknownModelError:
        return UnknownModelError(f"config {self.where}: {key} is {self.cfg[key]!r}; expected "
                                 f"{expected}")

    def _int(self, key: str, least: int) -> int | None:
        value = self.value(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise self._bad(key, "a positive integer" if least else "a non-negative integer")
        return value

    def positive_int(self, key: str) -> int | None:
        return self._int(key, 1)

    def non_negative_int(self, key: str) -> int:
        return self._int(key, 0) or 0

    def int_list(self, key: str) -> list[int]:
        value = self.value(key) or []
        if not isinstance(value, list) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
            raise self._bad(key, "a list of layer numbers")
        return value

    def positive_float(self, key: str) -> float | None:
        value = self.value(key)
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not 0 < value < float("inf")):
            raise self._bad(key, "a positive number")
        return float(value)

    def text(self, key: str) -> str | None:
        value = self.value(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value
