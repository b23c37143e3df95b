"""RoPE: rotary position embedding of q and k in one launch, in place.

For each token t at position p = positions[t] and each rotated pair (x1, x2) of a head with
pair index i < rotary_dim / 2:

    angle = p * theta ** (-2 i / rotary_dim)      (Llama 3, YaRN, linear: the frequency scaled
                                                   first)
    (x1, x2) <- (x1 cos(angle) - x2 sin(angle),  x2 cos(angle) + x1 sin(angle))
                                                  (YaRN: cos and sin times its attention_factor)

NeoX style pairs element i with element i + rotary_dim / 2 (rotate halves); GPT-J style pairs
elements 2i and 2i + 1 (interleaved). Only the first rotary_dim elements of a head rotate
(partial rotary); the rest stay as they are. Multimodal RoPE (Qwen2-VL's and Qwen3-VL's
mrope) gives each token three positions, temporal, height and width (positions is (3, tokens)),
and rotates each pair by one of them (mrope_stream), the rest as above.

q is (tokens, q_heads, head_dim) and k (tokens, kv_heads, head_dim), views into a fused qkv
projection as engines hold them, or strided views of wider heads: MLA's (DeepSeek-V3) q_pe, the
last rope dims of each q head, and k_pe, one head every q head shares; the token and head
strides are runtime values, so one compile serves both. cos and sin come either from cos_sin_cache
(max_position, rotary_dim), cos in its first half and sin in its second (vLLM's convention),
or are computed in the kernel from the position, theta and the frequency scaling (Llama 3's
stretches the low frequencies by `scaling_factor`, the high ones not, and blends between them by
how many turns a pair makes over the original context; YaRN blends them by the pair's index
along a ramp between two correction dimensions, and scales cos and sin by its attention factor,
which a YaRN cache's rows hold already, as vLLM's do; linear scaling, Gemma 3's full-attention
layers', divides every frequency by `scaling_factor`): the config's `cos_sin` chooses, so
the tuner picks whichever is faster for the shape; both compute the same rotation. The token
count and strides are dynamic; everything else is compile-time.

Work split: `chunks` threads cover the rotated pairs of one head, VEC consecutive elements each
(in each half for NeoX); each thread rotates the same chunk of `heads_per_thread` heads of its
token, so the cos and sin it loads or computes serve all of them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from cutetune.kernels.block_limits import (
    MAX_ELEMENTS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES, vector_elements
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Peer,
    PeerUnavailable,
    Tensors,
    register,
)
from cutetune.kernels.rope_frequencies import GPTJ as GPTJ  # the styles: rope's names too
from cutetune.kernels.rope_frequencies import (
    MROPE_INTERLEAVED,
    MROPE_NONE,
    MROPE_SECTIONS,
    MROPES,
    NEOX,
    STREAMS,
    STYLES,
    cos_sin_table,
    problem_cos_sin,
    rotated,
    yarn_attention_factor,
    yarn_ramp,
)
from cutetune.spaces.models import LayerRope, ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space

POSITION_DTYPES: dict[str, torch.dtype] = {"int32": torch.int32, "int64": torch.int64}
POSITION_BYTES = {"int32": 4, "int64": 8}
CACHE = "cache"
COMPUTED = "computed"
# Frequency scalings, by transformers' rope_type.
DEFAULT = "default"
LLAMA3 = "llama3"
YARN = "yarn"
LINEAR = "linear"
SCALINGS = (DEFAULT, LLAMA3, YARN, LINEAR)
# The scaling fields of RopeProblem each scaling reads; the others stay at their defaults.
SCALING_FIELDS = {
    DEFAULT: (),
    LLAMA3: ("scaling_factor", "low_freq_factor", "high_freq_factor", "original_max_position"),
    YARN: ("scaling_factor", "original_max_position", "beta_fast", "beta_slow", "truncate",
           "attention_factor"),
    LINEAR: ("scaling_factor",),
}
SCALED_FIELDS = frozenset(name for names in SCALING_FIELDS.values() for name in names)
# The longest context the inputs of tests and tuning reach: positions are drawn up to it, where
# an fp32 angle would be off by a hundredth of a radian.
MAX_POSITION = 1 << 17
# Work of computing one pair's cos and sin in the kernel, in flops: the fp64 angle and its
# reduction to [-pi, pi] (about 10) and the fp32 sine and cosine (about 15 each).
SINCOS_FLOPS = 40

# (rtol, atol) against the float64 reference. A 16-bit cache holds cos and sin to 2^-9
# (bf16) or 2^-11 (fp16) of themselves: x1 cos - x2 sin of unit-normal data is then off by up
# to about 6.4 of those beside the output's own rounding, which FLOAT_TOLERANCE's atol does not
# cover where the result is near zero.
TOLERANCE = {"bfloat16": (1.6e-2, 2e-2), "float16": (2e-3, 4e-3), "float32": (1e-5, 1e-5)}


@dataclass(frozen=True, kw_only=True)
class RopeProblem(Problem):
    dtype: str
    head_dim: int
    rotary_dim: int
    q_heads: int
    kv_heads: int
    style: str
    positions_dtype: str
    cache_dtype: str
    theta: float
    # Llama 3's scaling (transformers' rope_parameters): the frequencies of pairs that turn
    # fewer than low_freq_factor times over the original_max_position tokens are divided by
    # scaling_factor, those that turn more than high_freq_factor times are kept, those between
    # blended. At their defaults where the scaling does not read them (SCALING_FIELDS).
    scaling: str = DEFAULT
    scaling_factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 1.0
    original_max_position: int = 0
    # YaRN's (transformers' rope_parameters, their defaults but for attention_factor): pairs
    # that turn more than beta_fast times over the original_max_position tokens keep their
    # frequency, those that turn fewer than beta_slow times are divided by scaling_factor, those
    # between blended along a ramp of pair indices (its ends rounded outwards where `truncate`);
    # cos and sin are multiplied by attention_factor, resolved as transformers resolves it
    # (yarn_attention_factor where the config states none). Linear scaling's: every
    # frequency divided by scaling_factor.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    # Multimodal RoPE (mrope_stream): positions (3, tokens), and the pairs each stream rotates,
    # mrope_t + mrope_h + mrope_w = rotary_dim / 2 (transformers' mrope_section); all 0 without.
    mrope: str = MROPE_NONE
    mrope_t: int = 0
    mrope_h: int = 0
    mrope_w: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use {', '.join(TORCH_DTYPES)}")
        if self.head_dim < 2:
            raise ValueError(f"head_dim must be at least 2, got {self.head_dim}")
        if not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and in "
                             f"[2, head_dim {self.head_dim}]")
        if self.q_heads < 1 or self.kv_heads < 1:
            raise ValueError(f"head counts must be positive, got q={self.q_heads} "
                             f"kv={self.kv_heads}")
        if self.style not in STYLES:
            raise ValueError(f"style {self.style!r} not supported: use {' or '.join(STYLES)}")
        if self.positions_dtype not in POSITION_DTYPES:
            raise ValueError(f"positions_dtype {self.positions_dtype!r} not supported: use "
                             f"{' or '.join(POSITION_DTYPES)}")
        if self.cache_dtype not in ("float32", self.dtype):
            raise ValueError(f"cache_dtype {self.cache_dtype!r} must be float32 or the dtype "
                             f"of q and k ({self.dtype})")
        if not 1 < self.theta < math.inf:
            raise ValueError(f"theta must be a finite number above 1, got {self.theta}")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling {self.scaling!r} not supported: use "
                             f"{' or '.join(SCALINGS)}")
        if not isinstance(self.truncate, bool):
            raise ValueError(f"truncate must be True or False, got {self.truncate!r}")
        stray = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.name in SCALED_FIELDS and f.name not in SCALING_FIELDS[self.scaling]
                 and getattr(self, f.name) != f.default]
        if stray:
            raise ValueError(f"the {self.scaling} scaling takes no factors, got "
                             f"{', '.join(stray)}")
        stated = ", ".join(f"{name}={getattr(self, name)!r}"
                           for name in SCALING_FIELDS[self.scaling])
        if self.scaling == LLAMA3 and not (
                1 <= self.scaling_factor < math.inf
                and 0 < self.low_freq_factor < self.high_freq_factor < math.inf
                and self.original_max_position >= 1):
            raise ValueError(f"llama3 scaling needs scaling_factor >= 1, 0 < low_freq_factor < "
                             f"high_freq_factor and original_max_position >= 1, got {stated}")
        if self.scaling == YARN and not (
                1 <= self.scaling_factor < math.inf and self.original_max_position >= 1
                and 0 < self.beta_slow <= self.beta_fast < math.inf
                and 0 < self.attention_factor < math.inf):
            raise ValueError(f"yarn scaling needs scaling_factor >= 1, original_max_position >= "
                             f"1, 0 < beta_slow <= beta_fast and attention_factor > 0, got "
                             f"{stated}")
        if self.scaling == LINEAR and not 0 < self.scaling_factor < math.inf:
            raise ValueError(f"linear scaling needs a finite scaling_factor > 0, got {stated}")
        self._check_mrope()

    def _check_mrope(self) -> None:
        sections = (self.mrope_t, self.mrope_h, self.mrope_w)
        if self.mrope not in MROPES:
            raise ValueError(f"mrope {self.mrope!r} not supported: use {', '.join(MROPES)}")
        if self.mrope == MROPE_NONE:
            if any(sections):
                raise ValueError(f"mrope sections {sections} given without mrope: name its "
                                 f"layout ({MROPE_SECTIONS} or {MROPE_INTERLEAVED})")
            return
        pairs = self.rotary_dim // 2
        if min(sections) < 0 or sum(sections) != pairs:
            raise ValueError(f"mrope sections {sections} must be at least 0 each and sum to "
                             f"rotary_dim / 2 = {pairs}")
        # Interleaved, the height stream takes pairs 1, 4, ..., 3 h - 2 and the width stream
        # pairs 2, 5, ..., 3 w - 1: each must end inside the rotated pairs.
        if self.mrope == MROPE_INTERLEAVED and (3 * self.mrope_h - 2 >= pairs
                                                or 3 * self.mrope_w - 1 >= pairs):
            raise ValueError(f"interleaved mrope sections {sections} run past the {pairs} "
                             "rotated pairs: 3 h - 2 and 3 w - 1 must be below them")
        if self.scaling != DEFAULT:
            raise ValueError(f"mrope with the {self.scaling} scaling is not supported: mrope "
                             "rotates by theta's frequencies as they are")

    @property
    def heads(self) -> int:
        return self.q_heads + self.kv_heads

    @property
    def llama3(self) -> tuple[float, float, float, int] | None:
        """(scaling_factor, low_freq_factor, high_freq_factor, original_max_position) under
        Llama 3's scaling, else None."""
        if self.scaling != LLAMA3:
            return None
        return (self.scaling_factor, self.low_freq_factor, self.high_freq_factor,
                self.original_max_position)

    @property
    def yarn(self) -> tuple[float, float, float, float] | None:
        """(scaling_factor, low, high, attention_factor) under YaRN's scaling, else None: pair
        i's frequency is divided by scaling_factor with the weight clamp((i - low) / (high -
        low), 0, 1) and kept with the rest (yarn_ramp gives low and high)."""
        if self.scaling != YARN:
            return None
        low, high = yarn_ramp(self.rotary_dim, self.theta, self.beta_fast, self.beta_slow,
                              self.original_max_position, self.truncate)
        return (self.scaling_factor, low, high, self.attention_factor)

    @property
    def linear(self) -> float | None:
        """scaling_factor under linear scaling (every frequency divided by it), else None."""
        return self.scaling_factor if self.scaling == LINEAR else None

    @property
    def frequency_scaling(self) -> tuple[str, tuple]:
        """The scaling as the device code computes it, one compile-time value: (scaling, its
        numbers), the numbers those of .llama3, .yarn, (scaling_factor,) under linear
        scaling, () under none."""
        if self.scaling == LINEAR:
            return self.scaling, (self.scaling_factor,)
        return self.scaling, self.llama3 or self.yarn or ()

    @property
    def mrope_sections(self) -> tuple[str, int, int, int] | None:
        """(mrope, mrope_t, mrope_h, mrope_w) under multimodal RoPE, else None."""
        if self.mrope == MROPE_NONE:
            return None
        return (self.mrope, self.mrope_t, self.mrope_h, self.mrope_w)

    @property
    def position_streams(self) -> int:
        """Rows of the positions tensor: three under mrope, else one (a (tokens,) tensor)."""
        return STREAMS if self.mrope != MROPE_NONE else 1


@dataclass(frozen=True)
class RopeConfig:
    cos_sin: str
    vector_bits: int
    heads_per_thread: int
    warps_per_block: int


def _vector_elements(problem: RopeProblem, config: RopeConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _pairs_per_vector(problem: RopeProblem, config: RopeConfig) -> int:
    """Rotated pairs in one thread's chunk: a NeoX chunk is a vector in each half, a GPT-J
    chunk one vector of interleaved pairs."""
    vec = _vector_elements(problem, config)
    return vec if problem.style == NEOX else vec // 2


def _chunks(problem: RopeProblem, config: RopeConfig) -> int:
    """Threads covering the rotated part of one head."""
    return problem.rotary_dim // 2 // _pairs_per_vector(problem, config)


def _q_head_groups(problem: RopeProblem, config: RopeConfig) -> int:
    return math.ceil(problem.q_heads / config.heads_per_thread)


def _head_groups(problem: RopeProblem, config: RopeConfig) -> int:
    """Threads per chunk of a token: q's and k's heads are grouped apart, so that each
    thread's heads are all q's or all k's."""
    return _q_head_groups(problem, config) + math.ceil(problem.kv_heads / config.heads_per_thread)


def _threads_per_token(problem: RopeProblem, config: RopeConfig) -> int:
    return _chunks(problem, config) * _head_groups(problem, config)


def _elements_per_thread(problem: RopeProblem, config: RopeConfig) -> int:
    """fp32 values a thread holds between its loads and its stores: its chunk of every head it
    rotates, and a cos and a sin per pair."""
    pairs = _pairs_per_vector(problem, config)
    return 2 * pairs * config.heads_per_thread + 2 * pairs


def _registers_per_thread(problem: RopeProblem, config: RopeConfig) -> int:
    # The computed form holds its fp64 frequencies too (two registers each).
    frequencies = 2 * _pairs_per_vector(problem, config) if config.cos_sin == COMPUTED else 0
    return estimated_registers(_elements_per_thread(problem, config) + frequencies)


def _whole_pairs(problem: RopeProblem, config: RopeConfig) -> bool:
    vec = _vector_elements(problem, config)
    return vec >= 1 and (problem.style == NEOX or vec % 2 == 0)


SPACE = Space(
    config_type=RopeConfig,
    params=(
        Param("cos_sin", (CACHE, COMPUTED),
              "cos and sin loaded from cos_sin_cache or computed from the position"),
        Param("vector_bits", (32, 64, 128), "bits per thread per global access of q and k"),
        Param("heads_per_thread", (1, 2, 4, 8),
              "heads of one token a thread rotates with the same cos and sin"),
        Param("warps_per_block", (1, 2, 4, 8, 16), "warps in one thread block"),
    ),
    constraints=(
        Constraint(
            "vector_holds_whole_pairs",
            "a vector must hold at least one element, and whole (even, odd) pairs in GPT-J "
            "style",
            lambda p, c, d: _whole_pairs(p, c),
        ),
        Constraint(
            "rotary_splits_into_whole_vectors",
            "each half of the rotated part (NeoX) or the rotated part (GPT-J) must split into "
            "whole vectors",
            lambda p, c, d: (p.rotary_dim // 2) % _pairs_per_vector(p, c) == 0,
        ),
        Constraint(
            "heads_start_on_vectors",
            "head_dim must be a multiple of the vector, so that every head starts on one",
            lambda p, c, d: p.head_dim % _vector_elements(p, c) == 0,
        ),
        Constraint(
            "heads_per_thread_within_q",
            "a thread may rotate at most q_heads heads (its heads are all q's or all k's)",
            lambda p, c, d: c.heads_per_thread <= max(p.q_heads, p.kv_heads),
        ),
        Constraint(
            "thread_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} values of its heads and "
            "their cos and sin",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: RopeProblem, device) -> RopeConfig:
    """The seed heuristic: cos and sin from the cache (vLLM's choice), the widest vector the
    rotated part splits into, one head per thread while the warps needed fit one per SM (decode:
    the most parallel launch) and otherwise up to four sharing their cos and sin (as many as a
    thread's registers hold), in blocks of 8 warps (blocks of 4-8 warps reach the copy ceiling,
    blocks of 1 warp do not)."""
    for bits in (128, 64, 32):
        decode = RopeConfig(CACHE, bits, 1, 1)
        if SPACE.first_violation(problem, decode, device) is None:
            break
    warps_needed = math.ceil(problem.num_tokens * _threads_per_token(problem, decode) / WARP)
    if warps_needed <= device.sm_count:
        return decode
    return next(config for config in (RopeConfig(CACHE, bits, heads, 8) for heads in (4, 2, 1))
                if SPACE.first_violation(problem, config, device) is None)


def _blocks(problem: RopeProblem, config: RopeConfig) -> int:
    threads = problem.num_tokens * _threads_per_token(problem, config)
    return math.ceil(threads / (config.warps_per_block * WARP))


def cost(problem: RopeProblem, config: RopeConfig, device) -> Cost:
    rotated = problem.num_tokens * problem.heads * problem.rotary_dim
    element_bytes = DTYPE_BYTES[problem.dtype]
    # Under mrope a chunk's pairs may rotate by any of the three streams: a cache row of each.
    cache_bytes = (problem.num_tokens * problem.position_streams * problem.rotary_dim
                   * DTYPE_BYTES[problem.cache_dtype] if config.cos_sin == CACHE else 0)
    # Every thread of a token computes the cos and sin of its own chunk.
    sincos = (problem.num_tokens * _head_groups(problem, config) * problem.rotary_dim // 2
              if config.cos_sin == COMPUTED else 0)
    return Cost(
        # The rotated part of each head read and written once (the rest is not touched), the
        # positions and the cache rows of the tokens read once.
        bytes_moved=(2 * rotated * element_bytes
                     + problem.num_tokens * problem.position_streams
                     * POSITION_BYTES[problem.positions_dtype]
                     + cache_bytes),
        # Two products and a sum per rotated element.
        flops=3 * rotated + SINCOS_FLOPS * sincos,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=(2 * _pairs_per_vector(problem, config)
                                    * config.heads_per_thread * element_bytes),
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/rope.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["positions"], tensors["q"], tensors["k"], tensors["cos_sin_cache"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, model problems


def reference(tensors: Tensors, problem: RopeProblem) -> dict[str, torch.Tensor]:
    """q and k rotated by the exact cos and sin of their positions (float64 angles; the result
    in fp32)."""
    cos, sin = problem_cos_sin(tensors["positions"], problem).chunk(2, dim=-1)
    return {name: rotated(tensors[name], cos, sin, problem.style).float() for name in ("q", "k")}


def make_inputs(problem: RopeProblem, device, generator: torch.Generator) -> Tensors:
    """q and k as views into one fused qkv projection output (MLA's problems too, whose q_pe
    and k_pe are strided views of wider rows in a model: a head moves the same bytes either
    way), positions drawn up to
    MAX_POSITION (so the precision of the angle at long context is tested; three streams of
    them under mrope, drawn apart, so a pair rotated by the wrong stream fails), and a
    cos_sin_cache of MAX_POSITION rows whose rows at those positions hold cos and sin computed
    in float64 and rounded once to its dtype; its other rows are NaN, so a kernel that reads
    the wrong row fails."""
    dtype = TORCH_DTYPES[problem.dtype]
    qkv = torch.randn(problem.num_tokens, problem.heads + problem.kv_heads, problem.head_dim,
                      generator=generator, device=device, dtype=torch.float32).to(dtype)
    shape = ((problem.num_tokens,) if problem.mrope_sections is None
             else (STREAMS, problem.num_tokens))
    positions = torch.randint(0, MAX_POSITION, shape, generator=generator, device=device,
                              dtype=POSITION_DTYPES[problem.positions_dtype])
    cache_dtype = TORCH_DTYPES[problem.cache_dtype]
    cache = torch.full((MAX_POSITION, problem.rotary_dim), math.nan, device=device,
                       dtype=cache_dtype)
    every = positions.flatten()  # every stream's positions: their rows are the ones read
    cache[every] = cos_sin_table(every, problem.rotary_dim, problem.theta, problem.llama3,
                                 problem.yarn, problem.linear).to(cache_dtype)
    return {
        "positions": positions,
        "q": qkv[:, : problem.q_heads],
        "k": qkv[:, problem.q_heads: problem.heads],
        "cos_sin_cache": cache,
    }


def problems_for_model(model: ModelShape, dtype: str) -> list[RopeProblem]:
    """One problem per rotation the model's kinds of attention layer rotate with (Gemma 3: its
    sliding-window layers' theta, its full-attention layers' theta scaled), int64 positions and
    the cache in the model's dtype, as vLLM holds them. The families cutetune reads rotate
    NeoX pairs of whole heads, but MLA (DeepSeek-V3, Kimi-K2, GLM-4.7-Flash): it rotates the
    last rope_head_dim elements of each q head and one k head that every head shares (q_pe and
    k_pe, strided views of q and of the kv_a projection), in interleaved pairs where the model
    says (rope_interleave), as vLLM rotates them."""
    if not model.ropes:
        raise NotApplicableError(f"model {model.name}'s config states no rope_theta")
    mla = model.mla
    if mla is not None:
        heads = dict(head_dim=mla.rope_head_dim, rotary_dim=mla.rope_head_dim,
                     q_heads=mla.q_heads, kv_heads=1, style=GPTJ if mla.interleaved else NEOX)
    else:
        heads = dict(head_dim=model.head_dim, rotary_dim=model.rotary_dim,
                     q_heads=model.num_q_heads, kv_heads=model.num_kv_heads, style=NEOX)
    return [RopeProblem(num_tokens=1, dtype=dtype, **heads, positions_dtype="int64",
                        cache_dtype=dtype, theta=layer.theta, **_scaling_fields(model, layer))
            for layer in model.ropes]


# What transformers requires a config's scaling to state (rope_parameters, by its names).
STATED_PARAMETERS = {
    LLAMA3: ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    YARN: ("factor", "original_max_position_embeddings"),
    LINEAR: ("factor",),
}


def _scaling_fields(model: ModelShape, layer: LayerRope) -> dict:
    """The problem's scaling fields of a kind of layer's rotation, with transformers' defaults
    for what it leaves out; NotApplicableError for a scaling rope does not compute yet, or one
    that leaves out what transformers requires of it."""
    if layer.scaling is None:
        return {}
    numbers = dict(layer.scaling_parameters)
    if layer.scaling == "mrope":
        t, h, w = model.mrope_section
        return dict(mrope=MROPE_INTERLEAVED if numbers.get("mrope_interleaved") else
                    MROPE_SECTIONS, mrope_t=t, mrope_h=h, mrope_w=w)
    missing = [key for key in STATED_PARAMETERS.get(layer.scaling, ()) if key not in numbers]
    if missing:
        raise NotApplicableError(f"model {model.name}'s {layer.scaling} scaling states no "
                                 f"{' or '.join(missing)}")
    if layer.scaling == LLAMA3:
        return dict(scaling=LLAMA3, scaling_factor=numbers["factor"],
                    low_freq_factor=numbers["low_freq_factor"],
                    high_freq_factor=numbers["high_freq_factor"],
                    original_max_position=int(numbers["original_max_position_embeddings"]))
    if layer.scaling == YARN:
        factor = numbers["factor"]
        attention = numbers.get("attention_factor")
        # transformers reads a beta of 0 as unstated, like a missing one.
        return dict(scaling=YARN, scaling_factor=factor,
                    original_max_position=int(numbers["original_max_position_embeddings"]),
                    beta_fast=numbers.get("beta_fast") or 32.0,
                    beta_slow=numbers.get("beta_slow") or 1.0,
                    truncate=bool(numbers.get("truncate", True)),
                    attention_factor=attention if attention is not None else
                    yarn_attention_factor(factor, numbers.get("mscale"),
                                          numbers.get("mscale_all_dim")))
    if layer.scaling == LINEAR:
        return dict(scaling=LINEAR, scaling_factor=numbers["factor"])
    raise NotApplicableError(f"model {model.name} scales its frequencies "
                             f"({layer.scaling}), which rope does not compute yet")


def _liger_rope(problem: RopeProblem):
    """Liger's Triton RoPE (NeoX pairs, in place on its own copy of q and k: it makes them
    contiguous). It takes cos and sin per token, as Hugging Face's rotary module hands them, so
    each call gathers the positions' rows of the cache first: the per-token tables a model
    builds once a step."""
    try:
        from liger_kernel.ops.rope import rope_forward
    except ImportError as err:
        raise PeerUnavailable(f"liger-kernel is not installed ({err})") from None
    if problem.style != NEOX or problem.mrope_sections is not None:
        raise PeerUnavailable("liger's rope rotates NeoX pairs of one position stream only")
    half = problem.rotary_dim // 2

    def run(t: Tensors) -> dict[str, torch.Tensor]:
        cache, positions = t["cos_sin_cache"], t["positions"]
        cos = cache[:, :half].index_select(0, positions)
        sin = cache[:, half:].index_select(0, positions)
        # (batch 1, heads, tokens, head_dim) over q's (tokens, heads, head_dim) storage.
        q, k = (x.unsqueeze(0).transpose(1, 2) for x in (t["q"], t["k"]))
        q, k, _, _ = rope_forward(q, k, cos, sin, rotary_dim=problem.rotary_dim)
        return {"q": q.transpose(1, 2)[0], "k": k.transpose(1, 2)[0]}

    return run


KERNEL = register(KernelDef(
    name="rope",
    description="rotary position embedding of q and k in one in-place launch",
    problem_type=RopeProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.rope"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("q", "k"),
    written_in_place=("q", "k"),
    tolerance=TOLERANCE,
    source_file=__file__,
    peers=(Peer("liger rope", _liger_rope),),
))
