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
    """A preset name (case-insensitive) or the path of a Hugging Face config.json."""
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
    except json.JSONDecodeError as err:
        raise UnknownModelError(f"{path} is not valid JSON: {err}") from None
    return model_from_hf_config(raw, name=path.parent.name or path.stem)


def model_from_hf_config(raw: dict, name: str) -> ModelShape:
    """Read the fields cutetune needs; multimodal configs nest them under `text_config`."""
    if not isinstance(raw, dict):
        raise UnknownModelError(f"config {name!r} is not a JSON object")
    cfg = raw.get("text_config") or raw
    if not isinstance(cfg, dict) or "hidden_size" not in cfg:
        raise UnknownModelError(f"config {name!r} has no hidden_size (nor text_config.hidden_size)")
    hidden = int(cfg["hidden_size"])
    q_heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", q_heads)
    head_dim = cfg.get("head_dim") or (hidden // q_heads if q_heads else None)
    model_type = str(cfg.get("model_type", raw.get("model_type", "")))
    # Qwen3 and Gemma 3 (and their variants) normalise q and k per head; the config has no
    # flag for it. Gemma's norms scale by (1 + w).
    gemma = model_type.startswith("gemma3")
    qk_norm = model_type.startswith("qwen3") or gemma or bool(cfg.get("use_qk_norm", False))
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    return ModelShape(
        name=name,
        hidden_size=hidden,
        num_q_heads=int(q_heads) if q_heads else None,
        num_kv_heads=int(kv_heads) if kv_heads else None,
        head_dim=int(head_dim) if head_dim else None,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qk_norm=qk_norm,
        num_experts=int(experts) if experts else None,
        experts_per_token=cfg.get("num_experts_per_tok"),
        expert_intermediate=cfg.get("moe_intermediate_size"),
        intermediate_size=cfg.get("intermediate_size"),
        norm_weight_bias=1.0 if gemma else 0.0,
        extra_norm_widths=tuple(int(cfg[key]) for key in ("q_lora_rank", "kv_lora_rank")
                                if cfg.get(key)),
        # Gemma 3 names it hidden_activation.
        hidden_act=str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"),
    )
