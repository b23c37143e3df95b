"""cutetune.rope: rotary position embedding of q and k in place."""

from __future__ import annotations

import math

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.rope import (
    DEFAULT,
    GPTJ,
    KERNEL,
    MROPE_INTERLEAVED,
    MROPE_NONE,
    MROPE_SECTIONS,
    NEOX,
    STREAMS,
    YARN,
    RopeProblem,
    yarn_attention_factor,
)
from cutetune.ops.checks import (
    check_bool,
    check_int,
    check_number,
    device_index,
    is_int,
    is_number,
)
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

POSITION_DTYPE_NAMES = {torch.int32: "int32", torch.int64: "int64"}
# What the fast path reads of the rotation's arguments, by the names this op gives them: its
# own, and those of the ops that rotate with them (qk_norm_rope, qk_norm_rope_kv).
ROTATION_FIELDS = {"dtype": DType("q"), "head_dim": Dim("q", 2),
                   "rotary_dim": Dim("cos_sin_cache", 1), "q_heads": Dim("q", 1),
                   "kv_heads": Dim("k", 1), "style": Value("is_neox"),
                   "positions_dtype": DType("positions"), "cache_dtype": DType("cos_sin_cache"),
                   "theta": Value("rope_theta"), "scaling": Value("scaling"),
                   "scaling_factor": Value("scaling_factor"),
                   "low_freq_factor": Value("low_freq_factor"),
                   "high_freq_factor": Value("high_freq_factor"),
                   "original_max_position": Value("original_max_position")}


def _check_inputs(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos_sin_cache: torch.Tensor, rope_theta: float, mrope: str) -> int:
    """Raise one clear error, naming the argument, for the first thing wrong with the inputs;
    return q's CUDA device index (-1: the CPU). Positions beyond the cache's rows cannot be
    seen without waiting for the device: the caller keeps them below cos_sin_cache.shape[0]."""
    named = (("positions", positions), ("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = q.dtype
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"q has dtype {dtype}: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if k.dtype is not dtype:
        raise TypeError(f"k has dtype {k.dtype} but q has {dtype}: they must match")
    if positions.dtype not in POSITION_DTYPE_NAMES:
        raise TypeError(f"positions has dtype {positions.dtype}: use torch.int32 or torch.int64")
    if cos_sin_cache.dtype not in (dtype, torch.float32):
        raise TypeError(f"cos_sin_cache has dtype {cos_sin_cache.dtype}: use torch.float32 or "
                        f"q's dtype {dtype}")
    device = device_index("rope", "q", q, named)
    q_shape, k_shape = tuple(q.shape), tuple(k.shape)
    if len(q_shape) != 3 or len(k_shape) != 3:
        raise ValueError(f"q and k must be (tokens, heads, head_dim), got shapes {q_shape} "
                         f"and {k_shape}")
    tokens, d = q_shape[0], q_shape[2]
    if k_shape[0] != tokens or k_shape[2] != d:
        raise ValueError(f"k {k_shape} must have q's tokens and head_dim (q is {q_shape})")
    if mrope == MROPE_NONE and tuple(positions.shape) != (tokens,):
        raise ValueError(f"positions must be ({tokens},), one per token of q, got shape "
                         f"{tuple(positions.shape)}")
    if mrope != MROPE_NONE and tuple(positions.shape) != (STREAMS, tokens):
        raise ValueError(f"positions must be ({STREAMS}, {tokens}) under mrope, a temporal, a "
                         f"height and a width position per token of q, got shape "
                         f"{tuple(positions.shape)}")
    if cos_sin_cache.dim() != 2 or not cos_sin_cache.is_contiguous():
        raise ValueError("cos_sin_cache must be a contiguous (max_position, rotary_dim) tensor, "
                         f"got shape {tuple(cos_sin_cache.shape)}")
    if cos_sin_cache.shape[0] < 1:
        # Every position would lie past its rows.
        raise ValueError("cos_sin_cache has no rows: it must hold one per position "
                         f"(max_position, rotary_dim), got shape {tuple(cos_sin_cache.shape)}")
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim % 2 or not 0 < rotary_dim <= d:
        raise ValueError(f"rotary_dim (cos_sin_cache's width) is {rotary_dim}: it must be even "
                         f"and at most head_dim {d}")
    if not positions.is_contiguous():
        raise ValueError(f"positions must be contiguous, got strides {positions.stride()}")
    q_stride, k_stride = q.stride(), k.stride()
    # A head's elements are contiguous; heads may be apart (MLA's q_pe: the last rope dims of
    # wider heads), but not overlap, which an in-place rotation would race on.
    for name, t, stride in (("q", q, q_stride), ("k", k, k_stride)):
        if stride[2] != 1 or (t.shape[1] > 1 and stride[1] < d):
            raise ValueError(f"{name}'s heads must each be contiguous and apart (strides (*, "
                             f"at least {d}, 1)), got {stride}")
    stride_bytes = ((q_stride[0] | k_stride[0] | q_stride[1] | k_stride[1])
                    * DTYPE_BYTES[DTYPE_NAMES[dtype]])
    if (q.data_ptr() | k.data_ptr() | cos_sin_cache.data_ptr() | stride_bytes) % 16:
        raise ValueError("q, k and cos_sin_cache must start 16-byte aligned, and the token and "
                         f"head strides of q and k ({q_stride[:2]}, {k_stride[:2]} elements) "
                         "must be multiples of 16 bytes")
    if not (is_number(rope_theta) and 1 < rope_theta < math.inf):
        raise ValueError(f"rope_theta must be a finite number above 1, got {rope_theta!r}")
    return device


def check_rotation(is_neox: object, scaling_factor: object, low_freq_factor: object,
                   high_freq_factor: object, original_max_position: object) -> None:
    """One clear error for the first thing wrong with the scalar arguments of the rotation
    that every rotating op takes (rope, qk_norm_rope, qk_norm_rope_kv) and that the problem
    would otherwise convert silently (float('8'), a truthy 'no'); its own checks judge the
    values."""
    check_bool("is_neox", is_neox)
    for name, value in (("scaling_factor", scaling_factor), ("low_freq_factor", low_freq_factor),
                        ("high_freq_factor", high_freq_factor)):
        check_number(name, value)
    check_int("original_max_position", original_max_position, minimum=0)


def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
         cos_sin_cache: torch.Tensor, rope_theta: float, is_neox: bool = True,
         scaling: str = DEFAULT, scaling_factor: float = 1.0, low_freq_factor: float = 1.0,
         high_freq_factor: float = 1.0, original_max_position: int = 0, beta_fast: float = 32.0,
         beta_slow: float = 1.0, truncate: bool = True,
         attention_factor: float | None = None, mrope_section: tuple[int, int, int] | None = None,
         mrope_interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first rotary_dim elements of every head of q (tokens, q_heads, head_dim) and
    k (tokens, kv_heads, head_dim) in place by the angles of `positions` (tokens,), int32 or
    int64, in one launch on the current stream: NeoX style (rotate halves) where `is_neox`,
    else GPT-J style (interleaved pairs).

    Multimodal RoPE (Qwen2-VL's, Qwen3-VL's mrope) where mrope_section (temporal, height,
    width: pairs per stream, summing to rotary_dim / 2) is given: positions is (3, tokens),
    each token's temporal, height and width positions, and each pair rotates by one stream's,
    in runs of pairs per stream, or interleaved (temporal, height, width, ...) where
    `mrope_interleaved`, as transformers and vLLM lay them out.

    cos_sin_cache is vLLM's (max_position, rotary_dim): cos of each pair's angle in its first
    half, sin in its second, for the frequencies rope_theta ** (-2i / rotary_dim), scaled as
    `scaling` says ("default": not; "llama3": Llama 3's scaling by scaling_factor,
    low_freq_factor, high_freq_factor and original_max_position, its config's rope_scaling;
    "yarn": YaRN's by scaling_factor, original_max_position, beta_fast, beta_slow and
    truncate, with cos and sin multiplied by attention_factor, as vLLM's YaRN cache holds them;
    "linear": every frequency divided by scaling_factor (Gemma 3's full-attention layers);
    attention_factor None: transformers' default, 0.1 ln(scaling_factor) + 1 under yarn, else
    1); its width is rotary_dim. The kernel reads it or computes cos and sin from rope_theta and
    the scaling, whichever was tuned faster, so the two must agree. q and k may be views into
    a fused qkv tensor, or strided views of wider heads: MLA's q_pe (q[..., nope:], its heads
    qk_nope_head_dim + qk_rope_head_dim apart) and k_pe (one head, the tail of the kv_a
    projection), with is_neox False where the model rotates interleaved pairs. On CPU tensors
    the op computes with the kernel's reference (exact angles) instead. Under torch.compile
    the call is the custom op cutetune::rope (no graph break)."""
    mrope, (mrope_t, mrope_h, mrope_w) = _mrope_fields(mrope_section, mrope_interleaved)
    _ROPE((positions, q, k, cos_sin_cache, rope_theta, is_neox, scaling, scaling_factor,
           low_freq_factor, high_freq_factor, original_max_position, beta_fast, beta_slow,
           truncate, attention_factor, mrope, mrope_t, mrope_h, mrope_w))
    return q, k


def _mrope_fields(mrope_section: tuple[int, int, int] | None,
                  mrope_interleaved: bool) -> tuple[str, tuple[int, int, int]]:
    """The problem's mrope fields of the op's arguments (scalars: the fast path keys them).
    Every call makes them, so the common call (no mrope) does no more than test for one."""
    if mrope_section is None:
        if mrope_interleaved:
            raise ValueError("mrope_interleaved is set but mrope_section is None: give the "
                             "pairs of each position stream")
        return MROPE_NONE, (0, 0, 0)
    check_bool("mrope_interleaved", mrope_interleaved)
    section = tuple(mrope_section) if isinstance(mrope_section, tuple | list) else ()
    if len(section) != STREAMS or not all(is_int(n) for n in section):
        raise ValueError(f"mrope_section must be three counts of pairs (temporal, height, "
                         f"width), got {mrope_section!r}")
    return MROPE_INTERLEAVED if mrope_interleaved else MROPE_SECTIONS, section


def _check_yarn(beta_fast: object, beta_slow: object, attention_factor: object) -> None:
    """The YaRN arguments rope alone takes, numbers (attention_factor None: transformers'
    default); the problem judges their values."""
    check_number("beta_fast", beta_fast)
    check_number("beta_slow", beta_slow)
    if attention_factor is not None:
        check_number("attention_factor", attention_factor)


def _checked(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             cos_sin_cache: torch.Tensor, rope_theta: float, is_neox: bool, scaling: str,
             scaling_factor: float, low_freq_factor: float, high_freq_factor: float,
             original_max_position: int, beta_fast: float, beta_slow: float, truncate: bool,
             attention_factor: float | None, mrope: str, mrope_t: int, mrope_h: int,
             mrope_w: int, allocated: None) -> Checked:
    device = _check_inputs(positions, q, k, cos_sin_cache, rope_theta, mrope)
    check_rotation(is_neox, scaling_factor, low_freq_factor, high_freq_factor,
                   original_max_position)
    _check_yarn(beta_fast, beta_slow, attention_factor)
    if attention_factor is None:
        attention_factor = yarn_attention_factor(scaling_factor) if scaling == YARN else 1.0
    # The problem's own checks name the scaling's arguments (the fields have their names).
    problem = RopeProblem(
        num_tokens=max(1, q.shape[0]), dtype=DTYPE_NAMES[q.dtype], head_dim=q.shape[2],
        rotary_dim=cos_sin_cache.shape[1], q_heads=q.shape[1], kv_heads=k.shape[1],
        style=NEOX if is_neox else GPTJ, positions_dtype=POSITION_DTYPE_NAMES[positions.dtype],
        cache_dtype=DTYPE_NAMES[cos_sin_cache.dtype], theta=float(rope_theta), scaling=scaling,
        scaling_factor=float(scaling_factor), low_freq_factor=float(low_freq_factor),
        high_freq_factor=float(high_freq_factor), original_max_position=original_max_position,
        beta_fast=float(beta_fast), beta_slow=float(beta_slow), truncate=truncate,
        attention_factor=float(attention_factor), mrope=mrope, mrope_t=mrope_t,
        mrope_h=mrope_h, mrope_w=mrope_w)
    tokens = q.shape[0]
    if tokens == 0:
        return Checked(None)
    return Checked(None, (positions, q, k, cos_sin_cache, rope_theta, is_neox, scaling,
                          scaling_factor, low_freq_factor, high_freq_factor,
                          original_max_position, beta_fast, beta_slow, truncate,
                          attention_factor, mrope, mrope_t, mrope_h, mrope_w),
                   problem.static_tuple(), tokens, device)


def _rope_op(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             cos_sin_cache: torch.Tensor, rope_theta: float, is_neox: bool, scaling: str,
             scaling_factor: float, low_freq_factor: float, high_freq_factor: float,
             original_max_position: int, beta_fast: float, beta_slow: float, truncate: bool,
             attention_factor: float | None, mrope: str, mrope_t: int, mrope_h: int,
             mrope_w: int) -> None:
    """The custom op's body: the eager op's call (a compiled graph runs it, not compiling).
    It takes the call as the op serves it, mrope as the problem's fields (what `rope` makes
    of mrope_section and mrope_interleaved)."""
    _ROPE((positions, q, k, cos_sin_cache, rope_theta, is_neox, scaling, scaling_factor,
           low_freq_factor, high_freq_factor, original_max_position, beta_fast, beta_slow,
           truncate, attention_factor, mrope, mrope_t, mrope_h, mrope_w))


_ROPE = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("positions", "q", "k", "cos_sin_cache", "rope_theta", "is_neox", "scaling",
                   "scaling_factor", "low_freq_factor", "high_freq_factor",
                   "original_max_position", "beta_fast", "beta_slow", "truncate",
                   "attention_factor", "mrope", "mrope_t", "mrope_h", "mrope_w"),
        launched=4, tokens=Dim("q", 0),
        # The key holds no row count: a cache without rows must reach the checks.
        nonempty=(Dim("cos_sin_cache", 0),),
        fields={**ROTATION_FIELDS, "beta_fast": Value("beta_fast"), "beta_slow": Value("beta_slow"),
                "truncate": Value("truncate"),
                # None (transformers' default) keys apart from the value it stands for: the
                # same problem, reached by two keys.
                "attention_factor": Value("attention_factor"), "mrope": Value("mrope"),
                "mrope_t": Value("mrope_t"), "mrope_h": Value("mrope_h"),
                "mrope_w": Value("mrope_w")}),
    check=_checked,
    functions=(rope,),
    custom_ops=(CustomOp("rope", _rope_op, mutates=("q", "k")),),
    calls=lambda t, problem: {"rope": lambda: rope(
        t["positions"], t["q"], t["k"], t["cos_sin_cache"], problem.theta,
        problem.style == NEOX, problem.scaling, problem.scaling_factor, problem.low_freq_factor,
        problem.high_freq_factor, problem.original_max_position, problem.beta_fast,
        problem.beta_slow, problem.truncate, problem.attention_factor,
        None if problem.mrope_sections is None else problem.mrope_sections[1:],
        problem.mrope == MROPE_INTERLEAVED)},
))
