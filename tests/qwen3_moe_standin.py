"""A Qwen3-MoE-shaped causal LM in plain torch, computed the way transformers 4.57's
modeling_qwen3_moe computes it and with its class and attribute names, so that cutetune's
transformers integration patches it where that release is not installed (the GPU machine has
none or 5.x).
`transformers_stub` stands in for the two things the integration reads from the package: its
version and the registry of attention implementations (the stand-in attends eagerly)."""

from __future__ import annotations

import sys
import types
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional


@dataclass(frozen=True)
class StandinShape:
    """The config fields the stand-in reads, named as transformers' Qwen3MoeConfig names them."""

    hidden_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    vocab_size: int = 512
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    num_hidden_layers: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6


TINY = StandinShape()
# Qwen3-30B-A3B's layer (DESIGN.md's table), with a small vocabulary: the benchmark's model.
QWEN3_30B_A3B_LAYERS = StandinShape(hidden_size=2048, num_attention_heads=32,
                                    num_key_value_heads=4, num_experts=128, num_experts_per_tok=8,
                                    moe_intermediate_size=768, vocab_size=4096)
VOCAB = TINY.vocab_size


class StandinConfig:
    model_type = "qwen3_moe"
    _attn_implementation = "eager"

    def __init__(self, shape: StandinShape, name: str = "qwen3-moe-standin"):
        self.shape = shape
        self.name_or_path = name

    def to_dict(self) -> dict:
        return dict(asdict(self.shape), model_type=self.model_type, norm_topk_prob=True,
                    hidden_act="silu", intermediate_size=4 * self.shape.hidden_size)


def transformers_stub() -> dict[str, types.ModuleType]:
    """sys.modules entries for a `transformers` that is the release the forwards follow."""
    package = types.ModuleType("transformers")
    package.__version__ = "4.57.1"
    modeling_utils = types.ModuleType("transformers.modeling_utils")
    modeling_utils.ALL_ATTENTION_FUNCTIONS = {}
    package.modeling_utils = modeling_utils
    return {"transformers": package, "transformers.modeling_utils": modeling_utils}


def transformers_or_stub(monkeypatch=None) -> None:
    """The installed transformers where it is the release the forwards follow, else the stub
    (undone at the test's end when a pytest monkeypatch is given; for the process's life
    otherwise). The GPU machine has none or another release (5.x)."""
    from cutetune.integrations.transformers import TRANSFORMERS_VERSIONS

    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None and transformers.__version__.startswith(
            TRANSFORMERS_VERSIONS + "."):
        return
    for name, module in transformers_stub().items():
        if monkeypatch is None:
            sys.modules[name] = module
        else:
            monkeypatch.setitem(sys.modules, name, module)


class Qwen3MoeRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Qwen3MoeMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, shape: StandinShape):
        super().__init__()
        self.num_experts, self.top_k = shape.num_experts, shape.num_experts_per_tok
        self.norm_topk_prob = True
        self.gate = nn.Linear(shape.hidden_size, shape.num_experts, bias=False)
        self.experts = nn.ModuleList([
            Qwen3MoeMLP(shape.hidden_size, shape.moe_intermediate_size)
            for _ in range(shape.num_experts)])

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = functional.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim),
                                          dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = functional.one_hot(selected_experts,
                                         num_classes=self.num_experts).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states, router_logits


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep,
                                                           slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                            **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


class Qwen3MoeAttention(nn.Module):
    def __init__(self, config: StandinConfig, layer_idx: int):
        super().__init__()
        shape = config.shape
        hidden, heads, kv_heads, d = (shape.hidden_size, shape.num_attention_heads,
                                      shape.num_key_value_heads, shape.head_dim)
        self.config, self.layer_idx, self.head_dim = config, layer_idx, d
        self.num_key_value_groups = heads // kv_heads
        self.scaling = d ** -0.5
        self.attention_dropout, self.sliding_window = 0.0, None
        self.q_proj = nn.Linear(hidden, heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False)
        self.q_norm = Qwen3MoeRMSNorm(d, shape.rms_norm_eps)
        self.k_norm = Qwen3MoeRMSNorm(d, shape.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, dropout=0.0,
            scaling=self.scaling, sliding_window=self.sliding_window)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config: StandinConfig, layer_idx: int):
        super().__init__()
        shape = config.shape
        self.self_attn = Qwen3MoeAttention(config, layer_idx)
        self.mlp = Qwen3MoeSparseMoeBlock(shape)
        self.input_layernorm = Qwen3MoeRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = Qwen3MoeRMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states,
                                          position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if isinstance(hidden_states, tuple):
            hidden_states, _ = hidden_states
        return residual + hidden_states


class Qwen3MoeStandin(nn.Module):
    """embed, the decoder layers, the final norm, lm_head; rotary embeddings and a causal mask
    built on the device (a CUDA graph can capture the whole forward)."""

    def __init__(self, shape: StandinShape, name: str = "qwen3-moe-standin"):
        super().__init__()
        self.config = StandinConfig(shape, name)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList([Qwen3MoeDecoderLayer(self.config, i)
                                     for i in range(shape.num_hidden_layers)])
        self.norm = Qwen3MoeRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        exponents = torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim
        inv_freq = 1.0 / (shape.rope_theta ** exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        tokens = input_ids.shape[1]
        positions = torch.arange(tokens, device=input_ids.device, dtype=torch.float)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        position_embeddings = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        mask = torch.full((tokens, tokens), float("-inf"), device=input_ids.device,
                          dtype=self.dtype).triu(1)[None, None]
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings=position_embeddings,
                                  attention_mask=mask)
        return self.lm_head(self.norm(hidden_states))


def build_standin(dtype: torch.dtype, device, shape: StandinShape = TINY,
                  seed: int = 0) -> Qwen3MoeStandin:
    """Random weights with a transformer's scale (0.02), norms spread around 1."""
    torch.manual_seed(seed)
    model = Qwen3MoeStandin(shape)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.02)
    return model.to(device=device, dtype=dtype).eval()
