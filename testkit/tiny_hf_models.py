"""Tiny random-weight models of each family cutetune's transformers integration patches, built
from a config (no download), and their logits: for the integration's tests on the CPU. Imports
transformers: a test module skips first where it is not installed
(`pytest.importorskip("transformers")`)."""

from __future__ import annotations

import inspect

import torch
import transformers

VOCAB, TOKENS = 128, 7
# Shapes every op accepts: hidden 128 (rmsnorm takes 64 to 16384), head_dim 64 (qk_norm takes
# 64, 128, 256), intermediates whose bf16 rows are multiples of 16 bytes (the activations).
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64)
# bf16: the patched model rounds in other places than transformers' modules do (a norm rounds
# once, not twice; the MoE combine sums the experts' outputs in fp32), a few bf16 ulps of the
# logits (about 1 here) after two layers. fp32: the ops' CPU path is transformers' arithmetic.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5),
             torch.bfloat16: dict(rtol=1.6e-2, atol=3e-2)}
ROUTER_SHARPNESS = 20.0


def kv_cache_argument(model, cache) -> dict:
    """`cache` as the keyword argument `model`'s forward takes a KV cache by: `cache` from
    transformers 5.24 on, `past_key_values` before (the other name would pass into its kwargs
    unused, and the model would run without the cache)."""
    parameters = inspect.signature(type(model).forward).parameters
    return {"cache" if "cache" in parameters else "past_key_values": cache}


def llama(**overrides):
    return transformers.LlamaConfig(**{**COMMON, **overrides})


def qwen3(**overrides):
    return transformers.Qwen3Config(**{**COMMON, **overrides})


def qwen3_moe(**overrides):
    return transformers.Qwen3MoeConfig(**{**COMMON, "num_experts": 8, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 64, "norm_topk_prob": True,
                                          **overrides})


def gemma3(**overrides):
    # One sliding-window layer and one global one: the layer picks its rotary embedding.
    return transformers.Gemma3TextConfig(**{
        **COMMON, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
        **overrides})


# Each family's config, of COMMON's shape and the fields given.
FAMILIES = {"llama": llama, "qwen3": qwen3, "qwen3_moe": qwen3_moe, "gemma3": gemma3}


def build(family: str, dtype: torch.dtype, **overrides) -> torch.nn.Module:
    """The family's causal LM in `dtype`, built as from_pretrained builds it (its rotary
    embedding's frequencies stay fp32; a cast of the whole model would round them)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family](**overrides),
                                                          dtype=dtype).eval()
    with torch.no_grad():  # norms start at 1 (Gemma: 0); spread them so that a wrong weight shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.5 * torch.randn_like(parameter))
            # A random router is nearly uniform: each token's top-2 weights both near 0.5, so
            # weights given to the wrong experts would not show. Sharpen it.
            if name.endswith("mlp.gate.weight"):
                parameter.mul_(ROUTER_SHARPNESS)
    return model


def logits(model, ids=None, **kwargs) -> torch.Tensor:
    if ids is None:
        ids = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids, use_cache=False, **kwargs).logits
