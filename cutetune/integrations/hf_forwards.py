"""The forwards cutetune installs on a Hugging Face model's modules (which modules is decided by
cutetune.integrations.transformers). Each computes what the module's own forward computes, with
cutetune's ops in place of the torch operations they fuse; they are bound to the module
instance, so the modules, their parameters and the model's state_dict stay as they were. They
serve inference: the ops have no backward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional

from cutetune.kernels.rope import SCALING_FIELDS, RopeProblem
from cutetune.kernels.rope_frequencies import problem_cos_sin
from cutetune.ops.moe_combine import moe_combine
from cutetune.ops.moe_dispatch import moe_dispatch
from cutetune.ops.qk_norm import qk_norm
from cutetune.ops.qk_norm_rope import qk_norm_rope
from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm
from cutetune.ops.rope import rope

# The name of the tensor the patch adds to a gated MLP (a non-persistent buffer: it follows
# the module across devices but stays out of its state_dict).
GATE_UP_WEIGHT = "cutetune_gate_up_weight"


def reads(*paths: str) -> Callable[[Callable], Callable]:
    """Declares the attributes of its module that a forward reads (dotted: an attribute's own
    attribute), as the forward's `reads`. patch checks them before it installs anything, so a
    transformers release that renames one is refused at patch time, by name, rather than
    failing inside a forward."""
    def declare(forward: Callable) -> Callable:
        forward.reads = paths
        return forward
    return declare


@reads("weight")
def rmsnorm_forward(norm: torch.nn.Module, hidden_states: torch.Tensor, *, eps: float,
                    weight_bias: float) -> torch.Tensor:
    shape = hidden_states.shape
    out = rmsnorm(hidden_states.reshape(-1, shape[-1]), norm.weight, eps=eps,
                  weight_bias=weight_bias)
    return out.view(shape)


def _add_and_norm(x: torch.Tensor, fresh: torch.Tensor, weight: torch.Tensor, eps: float,
                  weight_bias: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + fresh), x + fresh) in one launch. `fresh` is a tensor the layer has just
    computed: it takes the sum in place, so the layer's input (which the caller may keep, e.g.
    as a recorded hidden state) is never written."""
    shape = fresh.shape
    hidden = shape[-1]
    normed, summed = fused_add_rmsnorm(x.reshape(-1, hidden), fresh.view(-1, hidden), weight,
                                       eps=eps, weight_bias=weight_bias)
    return normed.view(shape), summed.view(shape)


@reads("self_attn", "input_layernorm", "post_attention_layernorm.weight", "mlp")
def pre_norm_layer_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, *, eps: float,
                           weight_bias: float, **kwargs) -> torch.Tensor:
    """A Llama-style decoder layer (Llama, Qwen3, Qwen3-MoE): the residual add after attention
    runs inside the post-attention norm. `eps` and `weight_bias` are that norm's."""
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    normed, summed = _add_and_norm(hidden_states, attn_out,
                                   layer.post_attention_layernorm.weight, eps, weight_bias)
    return summed + layer.mlp(normed)


@reads("self_attn", "input_layernorm", "post_attention_layernorm",
       "pre_feedforward_layernorm.weight", "post_feedforward_layernorm", "mlp")
def sandwich_norm_layer_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, *,
                                eps: float, weight_bias: float, **kwargs) -> torch.Tensor:
    """A Gemma 3 decoder layer (norms before and after attention and MLP): the residual add
    after attention runs inside the pre-feedforward norm. `eps` and `weight_bias` are that
    norm's."""
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    normed, summed = _add_and_norm(hidden_states, layer.post_attention_layernorm(attn_out),
                                   layer.pre_feedforward_layernorm.weight, eps, weight_bias)
    return summed + layer.post_feedforward_layernorm(layer.mlp(normed))


# The name of the cos/sin cache the patch adds to transformers' rotary module (a
# non-persistent buffer), suffixed by the kind of layer where the kinds rotate differently.
COS_SIN_CACHE = "cutetune_cos_sin_cache"
# What the attention calls from its modeling module (patch passes them in: see below).
MODELING_FUNCTIONS = ("apply_rotary_pos_emb", "eager_attention_forward", "ALL_ATTENTION_FUNCTIONS")


# Rows of a cos/sin cache computed at a time: their float64 table is this times rotary_dim
# times 8 bytes (16 MiB at rotary_dim 128), not the whole cache's.
CACHE_BLOCK = 16384


def cos_sin_cache(problem: RopeProblem, rows: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """The cos/sin cache of `problem`'s rotation for positions 0 to rows - 1, in `dtype` on
    `device`: the float64 values the rope kernels' own inputs hold (problem_cos_sin), rounded
    once, which the kernels read or compute alike."""
    cache = torch.empty(rows, problem.rotary_dim, dtype=dtype, device=device)
    for start in range(0, rows, CACHE_BLOCK):
        positions = torch.arange(start, min(rows, start + CACHE_BLOCK), device=device)
        cache[start:start + len(positions)] = problem_cos_sin(positions, problem)
    return cache


@dataclass(frozen=True)
class Rotation:
    """The rotary embedding of an attention layer as cutetune's rope and qk_norm_rope take it:
    rope's `problem` of it, and its cos/sin cache, the buffer named `cache` that the patch adds
    to transformers' rotary module `rotary` (so that it follows the model across devices, held
    once for every layer that rotates alike). Positions index its rows, which the kernels do
    not bound-check: rows_for grows it before a call whose positions may pass them."""

    rotary: torch.nn.Module
    cache: str
    problem: RopeProblem

    @property
    def theta(self) -> float:
        return self.problem.theta

    @property
    def scaling(self) -> dict[str, object]:
        """The frequency scaling as the ops' keyword arguments."""
        return {"scaling": self.problem.scaling, **{
            name: getattr(self.problem, name) for name in SCALING_FIELDS[self.problem.scaling]}}

    def rows_for(self, positions_below: int) -> torch.Tensor:
        """The cos/sin cache, grown first where `positions_below` (a bound of the call's
        positions, known on the host) passes its rows: to twice its rows or the bound, if
        more, so that a generate grows it a few times, not once a step. Growing allocates,
        so it happens eagerly: a CUDA graph captured with the cache large enough replays
        without it; one whose capture would grow it is refused."""
        cache = getattr(self.rotary, self.cache)
        rows = cache.shape[0]
        if positions_below <= rows:
            return cache
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"positions up to {positions_below - 1} pass the {rows} rows of cutetune's "
                f"cos/sin cache {self.cache} inside a CUDA graph capture, where it cannot "
                "grow: run a step of that length eagerly before capturing")
        cache = cos_sin_cache(self.problem, max(positions_below, 2 * rows), cache.dtype,
                              cache.device)
        setattr(self.rotary, self.cache, cache)  # a registered buffer: replaced as one
        return cache


def positions_bound(cache, layer_idx: int, query_length: int) -> int:
    """A bound, known on the host, of the positions an attention call rotates: the KV cache's
    length before the call plus the query's (the positions transformers and generate pass run
    on from the cached length), the query's without a cache. A static cache counts its
    tokens on the device, which reading would wait for: its capacity (its full-attention
    layers' max_cache_len) bounds them instead. position_ids past this bound (a caller that
    passes its own, beyond the cached length) must stay below the cache's rows, which are
    the config's max_position_embeddings at least: the kernels do not check them."""
    if cache is None:
        return query_length
    length = cache.get_seq_length(layer_idx)
    if isinstance(length, torch.Tensor):
        return max(getattr(layer, "max_cache_len", 0) for layer in cache.layers)
    return length + query_length


def _positions(position_ids: torch.Tensor | None, input_shape: torch.Size) -> torch.Tensor:
    """The position of each row of q and k (batch, then sequence), contiguous: position_ids
    itself where it has one row per sequence, its one row repeated where transformers passes
    one for the batch (a copy then)."""
    if position_ids is None:
        raise ValueError("cutetune's rotary embedding reads the position_ids that transformers' "
                         "decoder layers pass to the attention; this call passed none")
    return position_ids.expand(input_shape).reshape(-1).contiguous()


def _token_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A projection's output (..., heads * head_dim) as (tokens, heads, head_dim): a view."""
    return x.view(-1, x.shape[-1] // head_dim, head_dim)


def qk_norm_then_rotary(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
                        hidden_shape: tuple, position_embeddings, position_ids,
                        positions_below: int, *, eps: float, weight_bias: float,
                        apply_rotary_pos_emb: Callable):
    """q and k normalised per head in one launch, in place, then rotated by transformers'
    `apply_rotary_pos_emb` with its cos and sin (no cos/sin cache of cutetune's, so no bound
    of the positions to heed): for a rotation rope cannot compute."""
    qk_norm(_token_heads(q, attn.head_dim), _token_heads(k, attn.head_dim), attn.q_norm.weight,
            attn.k_norm.weight, eps=eps, weight_bias=weight_bias)
    cos, sin = position_embeddings
    return apply_rotary_pos_emb(q.view(hidden_shape).transpose(1, 2),
                                k.view(hidden_shape).transpose(1, 2), cos, sin)


def qk_norm_rope_in_place(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
                          hidden_shape: tuple, position_embeddings, position_ids,
                          positions_below: int, *, rotation: Rotation, eps: float,
                          weight_bias: float):
    """q and k normalised per head and rotated by their positions in one launch, in place."""
    qk_norm_rope(_positions(position_ids, hidden_shape[:-2]), _token_heads(q, attn.head_dim),
                 _token_heads(k, attn.head_dim), attn.q_norm.weight, attn.k_norm.weight,
                 rotation.rows_for(positions_below), rotation.theta, eps, weight_bias, True,
                 **rotation.scaling)
    return q.view(hidden_shape).transpose(1, 2), k.view(hidden_shape).transpose(1, 2)


def rope_in_place(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, hidden_shape: tuple,
                  position_embeddings, position_ids, positions_below: int, *,
                  rotation: Rotation):
    """q and k rotated by their positions in one launch, in place (Llama: no q/k norm)."""
    rope(_positions(position_ids, hidden_shape[:-2]), _token_heads(q, attn.head_dim),
         _token_heads(k, attn.head_dim), rotation.rows_for(positions_below), rotation.theta,
         True, **rotation.scaling)
    return q.view(hidden_shape).transpose(1, 2), k.view(hidden_shape).transpose(1, 2)


@reads("head_dim", "q_proj", "k_proj", "v_proj", "o_proj", "layer_idx",
       "config._attn_implementation", "attention_dropout", "scaling")
def attention_forward(
        attn: torch.nn.Module, hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None, cache=None, past_key_values=None, *,
        rotate: Callable, eager_attention_forward: Callable, attention_functions, **kwargs):
    """The attention of Llama, Qwen3, Qwen3-MoE and Gemma 3 with q and k rotated (and, in the
    last three, normalised per head) by `rotate`, one of the functions above, bound to its
    arguments. The rest is theirs: `eager_attention_forward` and `attention_functions`
    (transformers' registry of the other implementations) come from the model's own modeling
    module. The KV cache arrives as `cache` from transformers 5.24 on, as `past_key_values`
    before; position_ids stays among the keyword arguments the implementation receives, as
    in transformers' forward. The bound of the positions (positions_bound) is taken before
    the cache takes this call's keys."""
    cache = cache if cache is not None else past_key_values
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    query_states, key_states = rotate(attn, attn.q_proj(hidden_states),
                                      attn.k_proj(hidden_states), hidden_shape,
                                      position_embeddings, kwargs.get("position_ids"),
                                      positions_bound(cache, attn.layer_idx, input_shape[-1]))
    value_states = attn.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    if cache is not None:
        key_states, value_states = cache.update(key_states, value_states, attn.layer_idx,
                                                kwargs=kwargs)
    interface = attention_functions.get_interface(attn.config._attn_implementation,
                                                  eager_attention_forward)
    # Llama's attention has no sliding window (transformers passes none for it).
    attn_output, attn_weights = interface(
        attn, query_states, key_states, value_states, attention_mask,
        dropout=attn.attention_dropout if attn.training else 0.0, scaling=attn.scaling,
        sliding_window=getattr(attn, "sliding_window", None), **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return attn.o_proj(attn_output), attn_weights


@reads("down_proj")
def gated_mlp_forward(mlp: torch.nn.Module, x: torch.Tensor, *,
                      act_and_mul: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with gate and up as one GEMM whose output is [gate | up],
    the layout the fused activation reads."""
    gate_up = functional.linear(x, getattr(mlp, GATE_UP_WEIGHT))
    shape = gate_up.shape
    act = act_and_mul(gate_up.view(-1, shape[-1]))
    return mlp.down_proj(act.view(*shape[:-1], shape[-1] // 2))


@reads("gate.num_experts", "experts.gate_up_proj", "experts.down_proj")
def sparse_moe_forward(block: torch.nn.Module, hidden_states: torch.Tensor, *, pad: int,
                       act_and_mul: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Qwen3-MoE's sparse block: its router called as the module it is (so that the model still
    records the router logits), then moe_dispatch, the experts' two GEMMs as grouped GEMMs over
    each expert's padded segment (torch._grouped_mm on the experts' own stacked weights:
    gate_up_proj (experts, 2 * intermediate, hidden), whose output is [gate | up], and
    down_proj (experts, hidden, intermediate)), the fused activation, and moe_combine's
    weighted sum (accumulated in fp32)."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    router, experts = block.gate, block.experts
    _, weights, chosen = router(x)
    routed = moe_dispatch(x, chosen.int(), router.num_experts, pad=pad)
    # Each expert's segment ends at offsets[e + 1]; rows past the last are never read.
    ends = routed.offsets[1:]
    gate_up = torch._grouped_mm(routed.dispatched, experts.gate_up_proj.transpose(1, 2),
                                offs=ends)
    expert_out = torch._grouped_mm(act_and_mul(gate_up), experts.down_proj.transpose(1, 2),
                                   offs=ends)
    # The router rounds the weights to the model's dtype; combine reads them as fp32.
    out = moe_combine(expert_out, routed.row_of, weights.float(), experts=router.num_experts,
                      pad=pad)
    return out.view(shape)
