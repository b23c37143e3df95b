"""Model shapes: the public presets and Hugging Face `config.json` files.

A model becomes the Problems of each kernel it uses; each kernel decides from a ModelShape which
problems it has (or says why it does not apply). A preset is a public model's config.json shipped
in `cutetune/spaces/presets/`, read like any other, so a preset and its model's config agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cutetune.spaces.hf_config import LayerRope, MlaShape, UnknownModelError, shape_fields
from cutetune.spaces.hf_quant import ActivationQuant, activation_quant, kv_cache_dtype


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
    # The dense MLP's width, where some decoder layer runs one (None for models whose every
    # layer routes to experts, whatever intermediate_size their config holds).
    intermediate_size: int | None = None
    # The shared experts' MLP width, beside the routed experts.
    shared_expert_intermediate: int | None = None
    # Gemma-style norms scale by (1 + w): 1.0; plain RMSNorm weights: 0.0.
    norm_weight_bias: float = 0.0
    # Widths of RMSNorms other than the hidden size (DeepSeek-V3's MLA normalises its q and kv
    # low-rank projections: q_lora_rank 1536, kv_lora_rank 512), and their eps where it is not
    # the model's (transformers builds those norms with their class's default).
    extra_norm_widths: tuple[int, ...] = ()
    extra_norm_eps: float | None = None
    # MLA attention's heads (num_q_heads, num_kv_heads and head_dim are None for it: no head
    # holds q and k whole), None for other attention.
    mla: MlaShape | None = None
    # The MLP's activation as Hugging Face names it (hidden_act): "silu", "gelu",
    # "gelu_pytorch_tanh", ...
    hidden_act: str = "silu"
    # Rotary position embedding as config.json states it: the rotation of each kind of
    # attention layer, one per distinct rotation (Gemma 3's sliding-window layers rotate by
    # their own theta, unscaled; its full-attention layers from 4B up scale theta's frequencies
    # linearly), empty where neither the config nor its Family's defaults state a theta; and
    # the share of a head it rotates.
    ropes: tuple[LayerRope, ...] = ()
    partial_rotary_factor: float = 1.0
    # Multimodal RoPE's pairs per position stream (temporal, height, width: mrope_section),
    # () without; whether they interleave is mrope_interleaved among the parameters.
    mrope_section: tuple[int, ...] = ()
    # Rows of the token embedding (config.json's vocab_size, or its class's default).
    vocab_size: int | None = None
    # What the token embedding's rows are multiplied by before the first layer: Gemma's
    # normaliser, sqrt(hidden_size) (applied rounded to the model's dtype); 1.0 for models
    # that feed the rows as they are.
    embedding_scale: float = 1.0
    # How its linear layers quantise their inputs (quantization_config), None where they read
    # them unquantised or the config's method is not one cutetune reads.
    activation_quant: ActivationQuant | None = None
    # The KV cache's element type a quantised checkpoint states ("float8_e4m3fn", ...), None
    # where it states none and the engine chooses.
    kv_cache_dtype: str | None = None

    @property
    def rotary_dim(self) -> int | None:
        """The elements of a head that rotary embedding rotates."""
        return None if self.head_dim is None else int(self.head_dim * self.partial_rotary_factor)


PRESETS_DIR = Path(__file__).with_name("presets")
PRESET_NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in PRESETS_DIR.glob("*.json")))


def _load_presets() -> dict[str, ModelShape]:
    return {name: model_from_hf_config(json.loads((PRESETS_DIR / f"{name}.json").read_text()),
                                       name=name)
            for name in PRESET_NAMES}


def load_model(spec: str) -> ModelShape:
    """A preset name (case-insensitive) or the path of a Hugging Face config.json (or of the
    folder holding one). UnknownModelError, one line naming the file, the field, what it holds
    and what is accepted, for anything else."""
    preset = PRESETS.get(spec.lower())
    if preset is not None:
        return preset
    path = Path(spec)
    try:
        if path.is_dir():
            path = path / "config.json"
        found = path.is_file()
    except OSError as err:  # a folder on the way that this user may not read
        raise UnknownModelError(f"cannot read {path}: {err.strerror}") from None
    if not found:
        raise UnknownModelError(
            f"unknown model {spec!r}: give a preset ({', '.join(PRESETS)}) "
            "or the path of a Hugging Face config.json"
        )
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UnknownModelError(f"{path} is not valid JSON: {err}") from None
    except RecursionError:
        raise UnknownModelError(f"{path} nests its JSON too deeply to be a config") from None
    except OSError as err:
        raise UnknownModelError(f"cannot read {path}: {err.strerror}") from None
    return model_from_hf_config(raw, name=_config_name(raw, path), source=str(path))


def _config_name(raw: object, path: Path) -> str:
    """The model a config file describes: its `_name_or_path` where it has one, else the file's
    name, or its folder's for a `config.json`."""
    named = raw.get("_name_or_path") if isinstance(raw, dict) else None
    if isinstance(named, str) and named.strip("/ "):
        return named.strip("/ ")
    if path.name == "config.json":
        return path.resolve().parent.name or path.stem
    return path.stem


def model_from_hf_config(raw: dict, name: str, source: str | None = None) -> ModelShape:
    """The model a Hugging Face config describes, read as transformers reads it (its
    model_type's defaults, and what its modeling code builds); multimodal configs nest the text
    model under `text_config`. `source` names the config in messages (default: `name`)."""
    fields = shape_fields(raw, source or name)
    where = source or name
    return ModelShape(name=name, **fields, activation_quant=activation_quant(raw, where),
                      kv_cache_dtype=kv_cache_dtype(raw, where))


PRESETS: dict[str, ModelShape] = _load_presets()
