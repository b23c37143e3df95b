"""A Qwen3-MoE-shaped causal LM in plain torch, computed the way transformers 5.x's
modeling_qwen3_moe computes it (the releases cutetune's forwards follow: TRANSFORMERS_VERSIONS)
and with its class and attribute names, so that cutetune's transformers integration patches it
where none of those releases is installed (the GPU machine may have none or another).
The integration reads what the attention calls from the model's modeling module: here, this
module, whose registry of attention implementations has none but eager (the stand-in attends
eagerly). `transformers_stub` stands in for the one thing it reads from the package: its
version."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
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
    max_position_embeddings: int = 4096


TINY = StandinShape()
VOCAB = TINY.vocab_size


class StandinConfig:
    model_type = "qwen3_moe"
    _attn_implementation = "eager"

    def __init__(self, shape: StandinShape, name: str = "qwen3-moe-standin"):
        self.shape = shape
        self.name_or_path = name
        # As transformers 5 states them.
        self.rope_parameters = {"rope_type": "default", "rope_theta": shape.rope_theta}
        self.max_position_embeddings = shape.max_position_embeddings

    def to_dict(self) -> dict:
        return dict(asdict(self.shape), model_type=self.model_type, norm_topk_prob=True,
                    hidden_act="silu", intermediate_size=4 * self.shape.hidden_size)


def transformers_stub() -> dict[str, types.ModuleType]:
    """sys.modules entries for a `transformers` that is the newest release the forwards
    follow."""
    from cutetune.integrations.transformers import FOLLOWED_RELEASES

    package = types.ModuleType("transformers")
    package.__version__ = "{}.{}.0".format(*FOLLOWED_RELEASES[-1])
    return {"transformers": package}


def transformers_or_stub(monkeypatch=None) -> None:
    """The installed transformers where it is a release the forwards follow, else the stub
    (undone at the test's end when a pytest monkeypatch is given; for the process's life
    otherwise). The GPU machine may have none or another release."""
    from cutetune.integrations.transformers import follows

    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None and follows(transformers.__version__):
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


class Qwen3MoeExperts(nn.Module):
    """Every expert's weights stacked: gate_up_proj (experts, 2 * intermediate, hidden) holds
    [gate; up], down_proj (experts, hidden, intermediate)."""

    def __init__(self, shape: StandinShape):
        super().__init__()
        self.num_experts = shape.num_experts
        self.hidden_dim, self.intermediate_dim = shape.hidden_size, shape.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(self.num_experts, 2 * self.intermediate_dim, self.hidden_dim))
        self.down_proj = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_dim, self.intermediate_dim))
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        expert_mask = functional.one_hot(top_k_index, num_classes=self.num_experts)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_idx = expert_idx[0]
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[token_idx]
            gate, up = functional.linear(current_state,
                                         self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
            current_hidden_states = self.act_fn(gate) * up
            current_hidden_states = functional.linear(current_hidden_states,
                                                      self.down_proj[expert_idx])
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos,
                                                                          None]
            final_hidden_states.index_add_(0, token_idx,
                                           current_hidden_states.to(final_hidden_states.dtype))
        return final_hidden_states


class Qwen3MoeTopKRouter(nn.Module):
    def __init__(self, shape: StandinShape):
        super().__init__()
        self.top_k, self.num_experts = shape.num_experts_per_tok, shape.num_experts
        self.norm_topk_prob = True
        self.hidden_dim = shape.hidden_size
        self.weight = nn.Parameter(torch.zeros(self.num_experts, self.hidden_dim))

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = functional.linear(hidden_states, self.weight)
        router_probs = functional.softmax(router_logits, dtype=torch.float, dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        return router_logits, router_top_value, router_indices


class Qwen3MoeRotaryEmbedding(nn.Module):
    """The default rotary embedding: inverse frequencies of theta, built in fp32, and the cos
    and sin of each position in the model's dtype."""

    def __init__(self, config: StandinConfig):
        super().__init__()
        shape = config.shape
        self.config, self.rope_type, self.attention_scaling = config, "default", 1.0
        exponents = torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim
        self.register_buffer("inv_freq", 1.0 / (shape.rope_theta ** exponents),
                             persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device,
                                                                    dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, shape: StandinShape):
        super().__init__()
        self.experts = Qwen3MoeExperts(shape)
        self.gate = Qwen3MoeTopKRouter(shape)

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states_reshaped = hidden_states.view(-1, hidden_dim)
        _, routing_weights, selected_experts = self.gate(hidden_states_reshaped)
        final_hidden_states = self.experts(hidden_states_reshaped, selected_experts,
                                           routing_weights)
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
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
        attn_weights = attn_weights + attention_mask
    attn_weights = functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


class AttentionInterface(dict):
    """transformers' registry of attention implementations, by name; the stand-in registers
    none, so every model attends with its modeling module's eager forward."""

    def get_interface(self, attn_implementation: str, default):
        return default if attn_implementation == "eager" else self[attn_implementation]


ALL_ATTENTION_FUNCTIONS = AttentionInterface()


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
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
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
        return residual + hidden_states


class Qwen3MoeStandin(nn.Module):
    """embed, the decoder layers, the final norm, lm_head; positions, their rotary embeddings
    and a causal mask built on the device (a CUDA graph can capture the whole forward); each
    layer gets the position_ids, as transformers' model passes them."""

    def __init__(self, shape: StandinShape, name: str = "qwen3-moe-standin"):
        super().__init__()
        self.config = StandinConfig(shape, name)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList([Qwen3MoeDecoderLayer(self.config, i)
                                     for i in range(shape.num_hidden_layers)])
        self.norm = Qwen3MoeRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.rotary_emb = Qwen3MoeRotaryEmbedding(self.config)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        tokens = input_ids.shape[1]
        position_ids = torch.arange(tokens, device=input_ids.device)[None]
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        mask = torch.full((tokens, tokens), float("-inf"), device=input_ids.device,
                          dtype=self.dtype).triu(1)[None, None]
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings=position_embeddings,
                                  attention_mask=mask, position_ids=position_ids)
        return self.lm_head(self.norm(hidden_states))


def build_standin(dtype: torch.dtype, device, shape: StandinShape = TINY,
                  seed: int = 0) -> Qwen3MoeStandin:
    """Random weights with a transformer's scale (0.02), norms spread around 1, in `dtype`;
    the rotary embedding's frequencies stay fp32, as transformers' from_pretrained keeps
    them."""
    torch.manual_seed(seed)
    model = Qwen3MoeStandin(shape)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.02)
    model = model.to(device=device).eval()
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)
    return model


@contextmanager
def routing_pinned(model: nn.Module, recorded: dict | None = None):
    """While open, each MoE router returns what it returned at its first call (a forward calls
    each once), so every later forward of the same tokens routes them as the first did; given
    `recorded` (what an earlier pinning yielded), the routers return that forward's answers. A
    patched model rounds in other places than the unpatched one (a norm rounds once, not
    twice), and a random model's router logits tie within that rounding for a few tokens of a
    batch; a tie broken the other way sends the token to other experts and, through attention,
    changes every later token. Pinned, a patched forward is compared with the unpatched one on
    the same routing (the router is torch in both)."""
    recorded = {} if recorded is None else recorded

    def pin(router, _args, output):
        return recorded.setdefault(router, output)

    handles = [module.register_forward_hook(pin) for module in model.modules()
               if type(module).__name__.endswith("TopKRouter")]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
