"""Model shapes: the public presets and Hugging Face `config.json` files.

A model becomes the Problems of each kernel it uses; each kernel decides from a ModelShape which
problems it has (or says why it does not apply).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    num_q_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    rms_norm_eps: float
    qk_norm: bool
    num_experts: int | None = None
    experts_per_token: int | None = None
    expert_intermediate: int | None = None
    intermediate_size: int | None = None
    # Gemma-style norms scale by (1 + w): 1.0; plain RMSNorm weights: 0.0.
    norm_weight_bias: float = 0.0
    # Widths of RMSNorms other than the hidden size (DeepSeek-V3's MLA normalises its q and kv
    # low-rank projections: q_lora_rank 1536, kv_lora_rank 512).
    extra_norm_widths: tuple[int, ...] = ()
    # The MLP's activation as Hugging Face names it (hidden_act): "silu", "gelu",
    # "gelu_pytorch_tanh", ...; every public preset uses SiLU.
    hidden_act: str = "silu"


PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("qwen3-0.6b", 1024, 16, 8, 128, 1e-6, True, intermediate_size=3072),
        ModelShape("qwen3-8b", 4096, 32, 8, 128, 1e-6, True, intermediate_size=12288),
        ModelShape("qwen3-32b", 5120, 64, 8, 128, 1e-6, True, intermediate_size=25600),
        ModelShape("qwen3-30b-a3b", 2048, 32, 4, 128, 1e-6, True, 128, 8, 768),
        ModelShape("qwen3-235b-a22b", 4096, 64, 4, 128, 1e-6, True, 128, 8, 1536),
        ModelShape("llama-3.1-8b", 4096, 32, 8, 128, 1e-5, False, intermediate_size=14336),
        ModelShape("llama-3.1-70b", 8192, 64, 8, 128, 1e-5, False, intermediate_size=28672),
        # DeepSeek-V3 attends with MLA: no per-head q/k shape in the table we follow.
        ModelShape("deepseek-v3", 7168, None, None, None, 1e-6, False, 256, 8, 2048,
                   intermediate_size=18432, extra_norm_widths=(1536, 512)),
        ModelShape("mixtral-8x7b", 4096, 32, 8, 128, 1e-5, False, 8, 2, 14336),
    )
}


class UnknownModelError(ValueError):
    pass


def load_model(spec: str) -> ModelShape:
    """A preset name (case-insensitive) or the path of a Hugging Face config.json (or of the
    folder holding one). UnknownModelError, one line naming the file, the field, what it holds
    and what is accepted, for anything else."""
    preset = PRESETS.get(spec.lower())
    if preset is not None:
        return preset
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UnknownModelError(
            f"unknown model {spec!r}: give a preset ({', '.join(PRESETS)}) "
            "or the path of a Hugging Face config.json"
        )
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UnknownModelError(f"{path} is not valid JSON: {err}") from None
    except OSError as err:
        raise UnknownModelError(f"cannot read {path}: {err.strerror}") from None
    return model_from_hf_config(raw, name=path.parent.name or path.stem, source=str(path))


def model_from_hf_config(raw: dict, name: str, source: str | None = None) -> ModelShape:
    """Read the fields cutetune needs; multimodal configs nest them under `text_config`.
    `source` names the config in messages (default: `name`)."""
    where = source or name
    if not isinstance(raw, dict):
        raise UnknownModelError(f"config {where}: expected a JSON object, found "
                                f"{type(raw).__name__}")
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise UnknownModelError(f"config {where}: text_config is {text!r}; expected an object")
    cfg = _Fields(text or raw, where)
    hidden = cfg.positive_int("hidden_size", required=True)
    q_heads = cfg.positive_int("num_attention_heads")
    kv_heads = cfg.positive_int("num_key_value_heads") or q_heads
    head_dim = cfg.positive_int("head_dim") or (hidden // q_heads if q_heads else None)
    model_type = cfg.text("model_type") or _Fields(raw, where).text("model_type") or ""
    # Qwen3 and Gemma 3 (and their variants) normalise q and k per head; the config has no
    # flag for it. Gemma's norms scale by (1 + w).
    gemma = model_type.startswith("gemma3")
    qk_norm = cfg.flag("use_qk_norm") or model_type.startswith("qwen3") or gemma
    # Each family names the expert count its own way; every name present is checked.
    experts = next((count for count in [cfg.positive_int(key) for key in (
        "num_experts", "n_routed_experts", "num_local_experts")] if count), None)
    top_k = cfg.positive_int("num_experts_per_tok")
    if experts and not top_k:
        raise UnknownModelError(f"config {where}: it has {experts} routed experts but no "
                                "num_experts_per_tok; a MoE model needs both")
    if top_k and experts and top_k > experts:
        raise UnknownModelError(f"config {where}: num_experts_per_tok is {top_k}, more than "
                                f"its {experts} experts; expected 1 to {experts}")
    return ModelShape(
        name=name,
        hidden_size=hidden,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.positive_float("rms_norm_eps", default=1e-6),
        qk_norm=qk_norm,
        num_experts=experts,
        experts_per_token=top_k if experts else None,
        expert_intermediate=cfg.positive_int("moe_intermediate_size"),
        intermediate_size=cfg.positive_int("intermediate_size"),
        norm_weight_bias=1.0 if gemma else 0.0,
        extra_norm_widths=tuple(width for key in ("q_lora_rank", "kv_lora_rank")
                                if (width := cfg.positive_int(key))),
        hidden_act=_activation(cfg),
    )


# gpt-oss's MLP clamps gate and up at `swiglu_limit`, takes gate * sigmoid(1.702 gate) times
# (up + 1), with gate and up interleaved: not SiLU, though its config names hidden_act "silu".
CLAMPED_SWIGLU = "swiglu_oai"


def _activation(cfg: _Fields) -> str:
    if cfg.positive_float("swiglu_limit") is not None:
        return CLAMPED_SWIGLU
    # Gemma 3 names it hidden_activation.
    return cfg.text("hidden_act") or cfg.text("hidden_activation") or "silu"


class _Fields:
    """Typed reads of a config's fields: a field of the wrong type or range is one line naming
    the config, the field, its value and what is accepted. Missing (or null) reads as None."""

    def __init__(self, cfg: dict, where: str):
        self.cfg = cfg
        self.where = where

    def _bad(self, key: str, expected: str) -> UnknownModelError:
        return UnknownModelError(f"config {self.where}: {key} is {self.cfg[key]!r}; expected "
                                 f"{expected}")

    def positive_int(self, key: str, required: bool = False) -> int | None:
        value = self.cfg.get(key)
        if value is None:
            if required:
                raise UnknownModelError(f"config {self.where}: no {key}; expected a positive "
                                        "integer")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self._bad(key, "a positive integer")
        return value

    def positive_float(self, key: str, default: float | None = None) -> float | None:
        value = self.cfg.get(key)
        if value is None:
            return default
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not 0 < value < float("inf")):
            raise self._bad(key, "a positive number")
        return float(value)

    def text(self, key: str) -> str | None:
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value
