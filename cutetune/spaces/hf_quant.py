"""A model's activation quantisation, read from its config.json's `quantization_config`.

A quantised model's linear layers read their inputs quantised: the kernels that write those
inputs (the quantisation, and the norm or activation fused with it) take their group size and
scale format from here. Three writers of quantization_config are read:

  fp8                 (transformers' FineGrainedFP8Config; DeepSeek-V3, Kimi-K2): with
                      weight_block_size [n, k], activations are quantised dynamically per token
                      in groups of k (1 x 128); scale_fmt "ue8m0" makes the scales powers of two.
                      Without weight_block_size, one scale per tensor.
  compressed-tensors  (llm-compressor): each config group's input_activations: 8-bit float by
                      strategy "group" (group_size), "token" or "tensor"; 4-bit float in groups
                      of 16 is NVFP4.
  modelopt            (NVIDIA Model Optimizer): quant_algo FP8 (one static scale per tensor),
                      FP8_PER_CHANNEL_PER_TOKEN, NVFP4 (group_size, 16 by default), MXFP8.

The KV cache's element type, where the checkpoint states one, is read from the same object
(kv_cache_dtype).

A method or algorithm that quantises weights only, or that this module does not know, reads as
no activation quantisation (None): such a model still tunes its unquantised kernels. A field of
a known method that holds the wrong type is one UnknownModelError line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cutetune.spaces.hf_config import UnknownModelError

# fp8_group: float8_e4m3fn values, one scale per group of group_size elements of a token's row.
# fp8_token: one scale per token (the whole row); fp8_tensor: one scale per tensor.
# mxfp8: e4m3 values in blocks of 32 with E8M0 scales (OCP microscaling).
# nvfp4: e2m1 values in blocks of 16 with e4m3 scales and one fp32 scale per tensor.
ActivationFormat = Literal["fp8_group", "fp8_token", "fp8_tensor", "mxfp8", "nvfp4"]
# fp32 scales; ue8m0: powers of two (an fp32 scale rounded up to 2^ceil(log2), or stored as
# E8M0 bytes); e4m3: NVFP4's block scales.
ScaleFormat = Literal["fp32", "ue8m0", "e4m3"]

MX_BLOCK = 32
NVFP4_BLOCK = 16


@dataclass(frozen=True)
class ActivationQuant:
    format: ActivationFormat
    # Elements per scale along a token's row; None where one scale covers the row or tensor.
    group_size: int | None
    scale_format: ScaleFormat = "fp32"


FP8_TENSOR = ActivationQuant("fp8_tensor", None)
FP8_TOKEN = ActivationQuant("fp8_token", None)
MXFP8 = ActivationQuant("mxfp8", MX_BLOCK, "ue8m0")


def _quantization_config(raw: dict, where: str) -> _Quant | None:
    """The config's quantization_config, at its top level or in a multimodal config's
    text_config, or None."""
    text = raw.get("text_config") or {}
    config = raw.get("quantization_config", text.get("quantization_config"))
    if config is None:
        return None
    if not isinstance(config, dict):
        raise UnknownModelError(f"config {where}: quantization_config is {config!r}; expected "
                                "an object")
    return _Quant(config, where, "quantization_config")


def activation_quant(raw: dict, where: str) -> ActivationQuant | None:
    """The activation quantisation a config (one shape_fields has read) states, or None."""
    config = _quantization_config(raw, where)
    if config is None:
        return None
    method = config.cfg.get("quant_method")
    reader = _READERS.get(method if isinstance(method, str) else "")
    return reader(config) if reader else None


# The KV cache's element types as the checkpoint's writers name them, by the dtype names the
# kernels use.
KV_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "int8": "int8", "nvfp4": "nvfp4"}


def kv_cache_dtype(raw: dict, where: str) -> str | None:
    """The KV cache's element type a quantised checkpoint states (its scales ship with it):
    modelopt's kv_cache_quant_algo ("FP8", "NVFP4", "INT8"), compressed-tensors'
    kv_cache_scheme (8-bit float is FP8 e4m3, as vLLM reads it); None where it states none, and
    the engine chooses (vLLM's --kv-cache-dtype, whose default is the model's dtype)."""
    config = _quantization_config(raw, where)
    if config is None:
        return None
    algo = config.text("kv_cache_quant_algo")
    if algo is not None:
        if algo.lower() not in KV_CACHE_DTYPES:
            raise config.bad("kv_cache_quant_algo", f"one of {', '.join(KV_CACHE_DTYPES)} "
                             "(any case) or null")
        return KV_CACHE_DTYPES[algo.lower()]
    scheme = config.child("kv_cache_scheme")
    if scheme is None:
        return None
    kind, bits = scheme.text("type"), scheme.positive_int("num_bits")
    if (kind, bits) == ("float", 8):
        return KV_CACHE_DTYPES["fp8"]
    if (kind, bits) == ("int", 8):
        return KV_CACHE_DTYPES["int8"]
    raise scheme.bad("num_bits", "8, of type float or int")


class _Quant:
    """Typed reads of one object of a quantization_config, named by its path in messages."""

    def __init__(self, cfg: dict, where: str, path: str):
        self.cfg, self.where, self.path = cfg, where, path

    def bad(self, key: str, expected: str) -> UnknownModelError:
        return UnknownModelError(f"config {self.where}: {self.path}.{key} is "
                                 f"{self.cfg.get(key)!r}; expected {expected}")

    def positive_int(self, key: str) -> int | None:
        value = self.cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise self.bad(key, "a positive integer")
        return value

    def text(self, key: str) -> str | None:
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, "a string")
        return value

    def child(self, key: str) -> _Quant | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.bad(key, "an object")
        return _Quant(value, self.where, f"{self.path}.{key}")


def _fp8(q: _Quant) -> ActivationQuant | None:
    block = q.cfg.get("weight_block_size")
    if block is None:
        return FP8_TENSOR
    if (not isinstance(block, list | tuple) or len(block) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in block)):
        raise q.bad("weight_block_size", "two positive integers [n, k]")
    scale = q.text("scale_fmt")
    if scale not in (None, "float", "ue8m0"):
        raise q.bad("scale_fmt", '"float" or "ue8m0"')
    return ActivationQuant("fp8_group", block[1], "ue8m0" if scale == "ue8m0" else "fp32")


def _compressed_tensors(q: _Quant) -> ActivationQuant | None:
    groups = q.child("config_groups")
    if groups is None:
        return None
    found = {_ct_activations(group.child("input_activations"))
             for name in groups.cfg if (group := groups.child(name)) is not None}
    found.discard(None)
    # A mixed recipe (one scheme per set of layers) is not one activation format.
    return found.pop() if len(found) == 1 else None


def _ct_activations(acts: _Quant | None) -> ActivationQuant | None:
    if acts is None or acts.text("type") != "float":
        return None
    bits = acts.positive_int("num_bits")
    strategy = acts.text("strategy")
    group = acts.positive_int("group_size")
    if bits == 4 and group == NVFP4_BLOCK:
        return ActivationQuant("nvfp4", NVFP4_BLOCK, "e4m3")
    if bits != 8:
        return None
    if strategy == "group":
        if group is None:
            raise acts.bad("group_size", 'a positive integer for strategy "group"')
        return ActivationQuant("fp8_group", group)
    return {"token": FP8_TOKEN, "tensor": FP8_TENSOR}.get(strategy or "")


def _modelopt(q: _Quant) -> ActivationQuant | None:
    algo = (q.text("quant_algo") or "").upper()
    if algo == "NVFP4":
        # Each place a group size may be given (the top level, each config group's input
        # activations) is checked where it is, so that a wrong one is named by its own path.
        groups = q.child("config_groups")
        holders = [q] + [acts for name in (groups.cfg if groups else ())
                         if (acts := (groups.child(name) or _Quant({}, q.where, ""))
                             .child("input_activations"))]
        for holder in holders:
            if holder.positive_int("group_size") not in (None, NVFP4_BLOCK):
                raise holder.bad("group_size",
                                 f"{NVFP4_BLOCK} for NVFP4 (e4m3 scales of 16 elements)")
        return ActivationQuant("nvfp4", NVFP4_BLOCK, "e4m3")
    return {"FP8": FP8_TENSOR, "FP8_PER_CHANNEL_PER_TOKEN": FP8_TOKEN,
            "MXFP8": MXFP8}.get(algo)


_READERS = {
    "fp8": _fp8,
    "mxfp8": lambda q: MXFP8,
    "compressed-tensors": _compressed_tensors,
    "modelopt": _modelopt,
}
