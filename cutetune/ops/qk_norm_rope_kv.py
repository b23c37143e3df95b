"""cutetune.qk_norm_rope_kv: cutetune.qk_norm_rope, and k and v written into a paged KV cache."""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall
from cutetune.kernels.qk_norm_rope_kv import CACHE_TORCH_DTYPES, KERNEL
from cutetune.kernels.rope import DEFAULT, NEOX
from cutetune.ops import qk_norm_rope as qk_norm_rope_op
from cutetune.ops.checks import device_index
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

TENSORS = ("positions", "q", "k", "v", "q_weight", "k_weight", "cos_sin_cache", "slot_mapping",
           "key_cache", "value_cache", "k_scale", "v_scale")
CACHE_DTYPE_NAMES = {dtype: name for name, dtype in CACHE_TORCH_DTYPES.items()}


def qk_norm_rope_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                    cos_sin_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, k_scale: torch.Tensor,
                    v_scale: torch.Tensor, rope_theta: float, eps: float = 1e-6,
                    weight_bias: float = 0.0, is_neox: bool = True, scaling: str = DEFAULT,
                    scaling_factor: float = 1.0, low_freq_factor: float = 1.0,
                    high_freq_factor: float = 1.0,
                    original_max_position: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cutetune.qk_norm_rope of q and k in place (its docstring says the arguments they share),
    and in the same launch k, normalised and rotated, and v (tokens, kv_heads, head_dim), as it
    is, written into vLLM's paged caches as its reshape_and_cache_flash writes them: token t
    into block slot_mapping[t] // block_size at offset slot_mapping[t] % block_size, nowhere
    where its slot is -1 (padding).

    key_cache and value_cache are (num_blocks, block_size, kv_heads, head_dim), each block's
    elements contiguous, in q's dtype or torch.float8_e4m3fn: then every value is divided by
    its scale, k_scale or v_scale (float32 tensors of one element), and rounded to FP8,
    saturating; in q's dtype the scales are not read. k's cache value is k as this op leaves
    it in q's dtype. slot_mapping is (tokens,) int64. A slot past the caches' blocks cannot be
    seen without waiting for the device: the caller keeps the slots below num_blocks *
    block_size. q, k and v may be views into a fused qkv tensor. On CPU tensors the op computes
    with the kernel's reference instead. Under torch.compile the call is the custom op
    cutetune::qk_norm_rope_kv (no graph break)."""
    _QK_NORM_ROPE_KV((positions, q, k, v, q_weight, k_weight, cos_sin_cache, slot_mapping,
                      key_cache, value_cache, k_scale, v_scale, rope_theta, eps, weight_bias,
                      is_neox, scaling, scaling_factor, low_freq_factor, high_freq_factor,
                      original_max_position))
    return q, k


def _check_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
              key_cache: torch.Tensor, value_cache: torch.Tensor, k_scale: torch.Tensor,
              v_scale: torch.Tensor) -> None:
    """One clear error, naming the argument, for the first thing wrong with the arguments
    qk_norm_rope does not take (its own checks passed: q and k are sound)."""
    named = (("v", v), ("slot_mapping", slot_mapping), ("key_cache", key_cache),
             ("value_cache", value_cache), ("k_scale", k_scale), ("v_scale", v_scale))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    device_index("qk_norm_rope_kv", "q", q, named)
    tokens, kv_heads, head_dim = k.shape
    if v.dtype is not q.dtype:
        raise TypeError(f"v has dtype {v.dtype} but q has {q.dtype}: they must match")
    if tuple(v.shape) != tuple(k.shape) or v.stride()[1:] != (head_dim, 1):
        raise ValueError(f"v must be k's shape {tuple(k.shape)} with contiguous heads (strides "
                         f"(*, {head_dim}, 1)), got shape {tuple(v.shape)}, strides "
                         f"{v.stride()}")
    if (v.data_ptr() | v.stride(0) * v.element_size()) % 16:
        raise ValueError("v must start 16-byte aligned and its token stride "
                         f"({v.stride(0)} elements) be a multiple of 16 bytes")
    if slot_mapping.dtype is not torch.int64:
        raise TypeError(f"slot_mapping has dtype {slot_mapping.dtype}: use torch.int64")
    if tuple(slot_mapping.shape) != (tokens,) or not slot_mapping.is_contiguous():
        raise ValueError(f"slot_mapping must be a contiguous ({tokens},), one slot per token of "
                         f"q, got shape {tuple(slot_mapping.shape)}")
    if key_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise TypeError(f"key_cache has dtype {key_cache.dtype}: use q's dtype {q.dtype} or "
                        "torch.float8_e4m3fn")
    if value_cache.dtype is not key_cache.dtype:
        raise TypeError(f"value_cache has dtype {value_cache.dtype} but key_cache has "
                        f"{key_cache.dtype}: they must match")
    shape = tuple(key_cache.shape)
    if len(shape) != 4 or shape[2:] != (kv_heads, head_dim) or shape[1] < 1:
        raise ValueError(f"key_cache must be (num_blocks, block_size, kv_heads {kv_heads}, "
                         f"head_dim {head_dim}), got shape {shape}")
    if shape[0] < 1:
        # Every slot would lie past the blocks: the kernel would write out of bounds.
        raise ValueError(f"key_cache must hold at least one block of {shape[1]} slots, got "
                         f"shape {shape}")
    if tuple(value_cache.shape) != shape:
        raise ValueError(f"value_cache must be key_cache's shape {shape} (its blocks of "
                         f"{shape[1]} slots), got {tuple(value_cache.shape)}")
    block = shape[1] * kv_heads * head_dim
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if (cache.stride()[1:] != (kv_heads * head_dim, head_dim, 1)
                or (cache.data_ptr() | cache.stride(0) * cache.element_size()) % 16):
            raise ValueError(f"{name} must hold each block's {block} elements contiguous, start "
                             "16-byte aligned, and have a block stride of a multiple of 16 "
                             f"bytes, got strides {cache.stride()}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale.dtype is not torch.float32 or scale.numel() != 1:
            raise ValueError(f"{name} must be a float32 tensor of one element, got "
                             f"{scale.dtype} of shape {tuple(scale.shape)}")


def _checked(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
             slot_mapping: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
             k_scale: torch.Tensor, v_scale: torch.Tensor, rope_theta: float, eps: float,
             weight_bias: float, is_neox: bool, scaling: str, scaling_factor: float,
             low_freq_factor: float, high_freq_factor: float, original_max_position: int,
             allocated: None) -> Checked:
    # qk_norm_rope's checks (and its problem), then the cache's: one error for the first
    # thing wrong.
    scalars = (rope_theta, eps, weight_bias, is_neox, scaling, scaling_factor, low_freq_factor,
               high_freq_factor, original_max_position)
    fused = qk_norm_rope_op._checked(positions, q, k, q_weight, k_weight, cos_sin_cache,
                                     *scalars, allocated)
    _check_kv(q, k, v, slot_mapping, key_cache, value_cache, k_scale, v_scale)
    if not fused.arguments:
        return Checked(None)
    # qk_norm_rope's problem and the cache's fields, which _check_kv has held to the problem's
    # own rules.
    static = (*fused.static, CACHE_DTYPE_NAMES[key_cache.dtype], key_cache.shape[1])
    return Checked(None, (positions, q, k, v, q_weight, k_weight, cos_sin_cache, slot_mapping,
                          key_cache, value_cache, k_scale, v_scale, *scalars),
                   static, fused.tokens, fused.device)


def _qk_norm_rope_kv_op(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        cos_sin_cache: torch.Tensor, slot_mapping: torch.Tensor,
                        key_cache: torch.Tensor, value_cache: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, rope_theta: float,
                        eps: float, weight_bias: float, is_neox: bool, scaling: str,
                        scaling_factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_max_position: int) -> None:
    """The custom op's body: the eager op (a compiled graph runs it, not compiling)."""
    qk_norm_rope_kv(positions, q, k, v, q_weight, k_weight, cos_sin_cache, slot_mapping,
                    key_cache, value_cache, k_scale, v_scale, rope_theta, eps, weight_bias,
                    is_neox, scaling, scaling_factor, low_freq_factor, high_freq_factor,
                    original_max_position)


_QK_NORM_ROPE_KV = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=(*TENSORS, *qk_norm_rope_op.SCALARS), launched=len(TENSORS),
        tokens=Dim("q", 0),
        fields={**qk_norm_rope_op.FIELDS, "kv_cache_dtype": DType("key_cache"),
                "block_size": Dim("key_cache", 1)},
        # The key holds no row or block count: a call with none must reach the checks, not
        # read or write past them.
        nonempty=(Dim("cos_sin_cache", 0), Dim("key_cache", 0), Dim("value_cache", 0))),
    check=_checked,
    functions=(qk_norm_rope_kv,),
    custom_ops=(CustomOp("qk_norm_rope_kv", _qk_norm_rope_kv_op,
                         mutates=("q", "k", "key_cache", "value_cache")),),
    calls=lambda t, problem: {"qk_norm_rope_kv": lambda: qk_norm_rope_kv(
        *(t[name] for name in TENSORS), problem.theta, problem.eps, problem.weight_bias,
        problem.style == NEOX, problem.scaling, problem.scaling_factor, problem.low_freq_factor,
        problem.high_freq_factor, problem.original_max_position)},
))
