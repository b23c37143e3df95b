"""QK-norm fused with RoPE: per-head RMSNorm of q and k, then their rotary embedding, in one
launch, in place.

    x <- (w + weight_bias) * x * rsqrt(mean(x^2) + eps)     for every (token, head)   (qk_norm)
    x <- x rotated by the angles of positions[token]                                  (rope)

The two steps are qk_norm's and rope's (the docstrings of cutetune.kernels.qk_norm and
cutetune.kernels.rope say them in full): the problem is rope's with qk_norm's eps and
weight_bias, its norm checked as qk_norm checks it, and the reference is qk_norm's reference
followed by rope's. Fused, each head is read and written once instead of twice, and the
normalised values go to the rotation in fp32, unrounded. Qwen3, Qwen3-MoE, Qwen3-Next and
Gemma 3 normalise q and k per head before rotating them.

Work split: qk_norm's. THREADS_PER_HEAD (= 32 / heads_per_warp) threads own one head; thread
`lane` holds vectors lane, lane + THREADS_PER_HEAD, ... of it, so each load instruction of a
warp is coalesced, and the squared sum is reduced by butterfly shuffles among the threads of
the head. Blocks [0, q_blocks) take q heads, the rest k heads.

The rotation partner: a NeoX pair joins element i and element i + rotary_dim / 2, and a thread
must hold both to rotate them. The space requires (constraint `rotated_part_whole_per_thread`)
that a half of the rotated part split into whole rows of the head's threads' vectors, so that
vector v of a thread (among the first half) has its partner in the same thread, as vector
v + rotary_dim / (2 * VEC * THREADS_PER_HEAD). The alternative, a warp shuffle for each
partner's element, costs VEC shuffles per vector (a shuffle moves 32 bits), against the head's
log2(THREADS_PER_HEAD) for its squared sum. The constraint costs the splits of fewer than two
vectors per thread where the whole head rotates (Qwen3, Gemma 3), and more where a part does:
Qwen3-Next rotates 64 of 256, so VEC * THREADS_PER_HEAD is at most 32 there and a thread holds
at least 8 vectors. A GPT-J pair lies within one vector (rope's `vector_holds_whole_pairs`);
the constraint then makes every thread rotate the same number of its vectors, so which vectors
rotate is known when compiling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from cutetune.kernels import qk_norm, rope
from cutetune.kernels.block_limits import (
    MAX_ELEMENTS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, vector_elements
from cutetune.kernels.registry import (
    ChainStep,
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    register,
)
from cutetune.kernels.rope import CACHE, COMPUTED, NEOX, RopeProblem
from cutetune.spaces.models import ModelShape
from cutetune.spaces.space import Constraint, Param, Space

# The frequency scalings the device code computes. rope's may grow (a new scaling lands in
# rope first): a problem of one this kernel does not compute is refused, not rotated wrongly.
SCALINGS = (rope.DEFAULT, rope.LLAMA3, rope.LINEAR)
# rope's problem fields of what this kernel does not compute (YaRN's parameters, mrope's
# streams): a problem holds their defaults, so its op keys none of them.
UNSERVED_ROPE_FIELDS = ("beta_fast", "beta_slow", "truncate", "attention_factor", "mrope",
                        "mrope_t", "mrope_h", "mrope_w")
# rope's tolerance is the wider of the two kernels' in every dtype (a 16-bit cache's cos and
# sin); the norm's fp32 output goes to the rotation unrounded, so it adds no rounding of its own.
TOLERANCE = rope.TOLERANCE


@dataclass(frozen=True, kw_only=True)
class QKNormRopeProblem(RopeProblem):
    eps: float
    weight_bias: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling {self.scaling!r} not supported by qk_norm_rope: use "
                             f"{' or '.join(SCALINGS)}")
        if self.mrope != rope.MROPE_NONE:
            raise ValueError(f"mrope {self.mrope!r} not supported by qk_norm_rope: its positions "
                             "are one stream")
        _ = self.norm  # qk_norm's own checks of head_dim, eps and weight_bias

    @property
    def rotation(self) -> RopeProblem:
        """The rotation's part of the problem, as rope states it."""
        return RopeProblem(**{f.name: getattr(self, f.name) for f in fields(RopeProblem)})

    @property
    def norm(self) -> qk_norm.QKNormProblem:
        """The norm's part of the problem, as qk_norm states it."""
        return qk_norm.QKNormProblem(num_tokens=self.num_tokens, dtype=self.dtype,
                                     head_dim=self.head_dim, q_heads=self.q_heads,
                                     kv_heads=self.kv_heads, eps=self.eps,
                                     weight_bias=self.weight_bias)


@dataclass(frozen=True)
class QKNormRopeConfig:
    cos_sin: str
    vector_bits: int
    heads_per_warp: int
    warps_per_block: int


def _norm_config(config: QKNormRopeConfig) -> qk_norm.QKNormConfig:
    """The point as qk_norm's: the same split of a head over its threads."""
    return qk_norm.QKNormConfig(config.vector_bits, config.heads_per_warp,
                                config.warps_per_block)


def _rope_config(config: QKNormRopeConfig) -> rope.RopeConfig:
    """The point as rope's, for what rope derives from the vector (its pairs)."""
    return rope.RopeConfig(config.cos_sin, config.vector_bits, 1, config.warps_per_block)


def _vector_elements(problem: QKNormRopeProblem, config: QKNormRopeConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _threads_per_head(config: QKNormRopeConfig) -> int:
    return WARP // config.heads_per_warp


def _pairs_per_vector(problem: QKNormRopeProblem, config: QKNormRopeConfig) -> int:
    return rope._pairs_per_vector(problem, _rope_config(config))


def _rotated_vectors(problem: QKNormRopeProblem, config: QKNormRopeConfig) -> float:
    """Vectors of one thread that rotate: of the first half in NeoX style (each with its
    partner in the second), of the rotated part in GPT-J style. Whole at valid points."""
    rotated = problem.rotary_dim // 2 if problem.style == NEOX else problem.rotary_dim
    return rotated / (_vector_elements(problem, config) * _threads_per_head(config))


def _elements_per_thread(problem: QKNormRopeProblem, config: QKNormRopeConfig) -> int:
    """fp32 values a thread holds across its wait for memory and its shuffles: its share of
    the head, and a cos and a sin per pair it rotates (the weights aside, as qk_norm counts)."""
    return (problem.head_dim + problem.rotary_dim) // _threads_per_head(config)


def _registers_per_thread(problem: QKNormRopeProblem, config: QKNormRopeConfig) -> int:
    # The head's and the weights' shares, the cos and sin; the computed form holds its fp64
    # frequencies too (two registers each).
    share = problem.head_dim // _threads_per_head(config)
    pairs = problem.rotary_dim // 2 // _threads_per_head(config)
    frequencies = 2 * pairs if config.cos_sin == COMPUTED else 0
    return estimated_registers(2 * share + 2 * pairs + frequencies)


def _borrowed(space: Space, name: str, problem_of, config_of) -> Constraint:
    """Constraint `name` of another kernel's space, held by this point seen as that kernel's
    problem and config."""
    original = next(c for c in space.constraints if c.name == name)
    return Constraint(name, original.reason,
                      lambda p, c, d: original.holds(problem_of(p), config_of(c), d))


SPACE = Space(
    config_type=QKNormRopeConfig,
    params=(
        Param("cos_sin", (CACHE, COMPUTED),
              "cos and sin loaded from cos_sin_cache or computed from the position"),
        Param("vector_bits", (32, 64, 128), "bits per thread per global access of q and k"),
        Param("heads_per_warp", (1, 2, 4, 8, 16, 32), "heads sharing one warp's shuffles"),
        Param("warps_per_block", (1, 2, 4, 8, 16), "warps in one thread block"),
    ),
    constraints=(
        _borrowed(rope.SPACE, "vector_holds_whole_pairs", lambda p: p, _rope_config),
        _borrowed(qk_norm.SPACE, "head_splits_into_whole_vectors", lambda p: p.norm,
                  _norm_config),
        _borrowed(qk_norm.SPACE, "vectors_per_thread_unrollable", lambda p: p.norm,
                  _norm_config),
        Constraint(
            "rotated_part_whole_per_thread",
            "each thread must rotate the same whole number of its vectors: in NeoX style a "
            "half of the rotated part, in GPT-J style the rotated part, splits into vectors "
            "of every thread of the head (so a NeoX pair's halves are one thread's, no "
            "shuffles)",
            lambda p, c, d: _rotated_vectors(p, c) >= 1
            and _rotated_vectors(p, c) == int(_rotated_vectors(p, c)),
        ),
        Constraint(
            "thread_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} values of its head and of "
            "their cos and sin",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: QKNormRopeProblem, device, space: Space = SPACE) -> QKNormRopeConfig:
    """The seed heuristic: cos and sin from the cache (vLLM's choice), the widest vector with
    the most threads per head that the rotation allows (the most parallel split), one warp per
    block while the warps needed fit one per SM (decode), else blocks of 8 warps (blocks of 4-8
    warps reach the copy ceiling, blocks of 1 warp do not), or the most the registers allow.
    EmptySpaceError, naming the constraints, for a problem no point serves (a rotated part that
    splits over no head's threads: rotary_dim 40 of head_dim 128). `space`: this one's, or that
    of a kernel of the same points that holds more per thread (qk_norm_rope_kv)."""
    decode = next((config for config in (
        QKNormRopeConfig(CACHE, bits, heads, 1)
        for bits in (128, 64, 32) for heads in (1, 2, 4, 8, 16, 32))
        if space.first_violation(problem, config, device) is None), None)
    if decode is None:
        # No point of one warp with a cache fits where none does: computing cos and sin and
        # larger blocks only take more registers.
        space.enumerate(problem, device).raise_if_empty(problem.describe())
    heads = problem.num_tokens * problem.heads
    if math.ceil(heads / decode.heads_per_warp) <= device.sm_count:
        return decode
    return next(config for config in (replace(decode, warps_per_block=w) for w in (8, 4, 2))
                if space.first_violation(problem, config, device) is None)


def cost(problem: QKNormRopeProblem, config: QKNormRopeConfig, device) -> Cost:
    heads = problem.num_tokens * problem.heads
    elements = heads * problem.head_dim
    rotated = heads * problem.rotary_dim
    element_bytes = DTYPE_BYTES[problem.dtype]
    cache_bytes = (problem.num_tokens * problem.rotary_dim * DTYPE_BYTES[problem.cache_dtype]
                   if config.cos_sin == CACHE else 0)
    # Every head's threads compute the cos and sin of the pairs they rotate.
    sincos = heads * problem.rotary_dim // 2 if config.cos_sin == COMPUTED else 0
    threads = _threads_per_head(config)
    return Cost(
        # Each head read and written once, both weight vectors, the positions and the cache
        # rows of the tokens read once.
        bytes_moved=(2 * elements * element_bytes + 2 * problem.head_dim * element_bytes
                     + problem.num_tokens * rope.POSITION_BYTES[problem.positions_dtype]
                     + cache_bytes),
        # The norm's four per element, the rotation's two products and a sum per rotated one.
        flops=4 * elements + 3 * rotated + rope.SINCOS_FLOPS * sincos,
        blocks=qk_norm._blocks(problem.norm, _norm_config(config)),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        # The head's share and, from the cache, its cos and sin.
        bytes_in_flight_per_thread=(
            problem.head_dim // threads * element_bytes
            + (problem.rotary_dim // threads * DTYPE_BYTES[problem.cache_dtype]
               if config.cos_sin == CACHE else 0)),
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/qk_norm_rope.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["positions"], tensors["q"], tensors["k"], tensors["q_weight"],
             tensors["k_weight"], tensors["cos_sin_cache"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, model problems


def reference(tensors: Tensors, problem: QKNormRopeProblem) -> dict[str, torch.Tensor]:
    """qk_norm's fp32 reference, then rope's float64 rotation of its output (the result in
    fp32)."""
    normalised = qk_norm.reference(tensors, problem.norm)
    return rope.reference({**tensors, **normalised}, problem)


def make_inputs(problem: QKNormRopeProblem, device, generator: torch.Generator) -> Tensors:
    """rope's inputs (q and k as views into one fused qkv projection output, positions up to
    rope.MAX_POSITION, a cache holding only their rows) and qk_norm's weights."""
    tensors = rope.make_inputs(problem, device, generator)
    return {**tensors, **qk_norm.make_weights(problem.head_dim, problem.dtype,
                                              problem.weight_bias, device, generator)}


def problems_for_model(model: ModelShape, dtype: str) -> list[QKNormRopeProblem]:
    """rope's problems of the model (one per theta) with qk_norm's eps and weight_bias; not
    applicable where either kernel is not."""
    (norm,) = qk_norm.problems_for_model(model, dtype)
    rotations = rope.problems_for_model(model, dtype)
    for rotation in rotations:
        if rotation.scaling not in SCALINGS or rotation.mrope != rope.MROPE_NONE:
            variant = (f"mrope ({rotation.mrope})" if rotation.mrope != rope.MROPE_NONE
                       else f"the {rotation.scaling} scaling")
            raise NotApplicableError(f"model {model.name} rotates with {variant}, which "
                                     "qk_norm_rope does not compute yet (rope does)")
    return [QKNormRopeProblem(**{**rotation.static_fields(), "num_tokens": 1},
                              eps=norm.eps, weight_bias=norm.weight_bias)
            for rotation in rotations]


KERNEL = register(KernelDef(
    name="qk_norm_rope",
    description="per-head RMSNorm then rotary embedding of q and k in one in-place launch",
    problem_type=QKNormRopeProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.qk_norm_rope"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("q", "k"),
    written_in_place=("q", "k"),
    tolerance=TOLERANCE,
    source_file=__file__,
    unfused=(ChainStep("qk_norm", lambda problem: problem.norm, rounds=True),
             ChainStep("rope", lambda problem: problem.rotation)),
))
