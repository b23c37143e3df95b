"""QK-norm: per-head RMSNorm of q and k in one launch, in place.

    y = (w + WEIGHT_BIAS) * x * rsqrt(mean(x^2) + EPS)      for every (token, head)

q is (tokens, q_heads, head_dim) and k (tokens, kv_heads, head_dim); both may be views into a
fused qkv projection (token stride larger than heads * head_dim). The token count and the token
strides are dynamic, so one compile serves every call of a model; head dim, head counts, dtype,
EPS and WEIGHT_BIAS are compile-time constants.

Work split: THREADS_PER_HEAD (= 32 / heads_per_warp) threads own one head; thread `lane` of a
head loads vectors lane, lane + THREADS_PER_HEAD, ... so each load instruction of a warp is
coalesced. The squared sum is reduced by butterfly shuffles among the threads of one head only.
Blocks [0, q_blocks) normalise q heads, the rest k heads, so the q/k choice is uniform per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels.block_limits import (
    MAX_ELEMENTS_PER_THREAD,
    MAX_VECTORS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import (
    DTYPE_BYTES,
    FLOAT_TOLERANCE,
    TORCH_DTYPES,
    vector_elements,
)
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Peer,
    PeerUnavailable,
    Tensors,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space

HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True, kw_only=True)
class QKNormProblem(Problem):
    dtype: str
    head_dim: int
    q_heads: int
    kv_heads: int
    eps: float
    weight_bias: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use {', '.join(TORCH_DTYPES)}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} not supported: use one of {HEAD_DIMS}")
        if self.q_heads < 1 or self.kv_heads < 1:
            raise ValueError(f"head counts must be positive, got q={self.q_heads} "
                             f"kv={self.kv_heads}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.weight_bias not in (0.0, 1.0):
            raise ValueError(f"weight_bias must be 0 or 1 (Gemma-style), got {self.weight_bias}")


@dataclass(frozen=True)
class QKNormConfig:
    vector_bits: int
    heads_per_warp: int
    warps_per_block: int


def _vector_elements(problem: QKNormProblem, config: QKNormConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _threads_per_head(config: QKNormConfig) -> int:
    return WARP // config.heads_per_warp


def _elements_per_thread(problem: QKNormProblem, config: QKNormConfig) -> int:
    return problem.head_dim // _threads_per_head(config)


def _registers_per_thread(problem: QKNormProblem, config: QKNormConfig) -> int:
    # The head's and the weights' shares in fp32.
    return estimated_registers(2 * _elements_per_thread(problem, config))


SPACE = Space(
    config_type=QKNormConfig,
    params=(
        Param("vector_bits", (32, 64, 128), "bits per thread per global access"),
        Param("heads_per_warp", (1, 2, 4, 8, 16, 32), "heads sharing one warp's shuffles"),
        # 16 warps already reach an SM's 2048-thread limit with 4 blocks: 32-warp blocks add
        # no occupancy, only coarser tails (and compiles).
        Param("warps_per_block", (1, 2, 4, 8, 16), "warps in one thread block"),
    ),
    constraints=(
        Constraint(
            "vector_holds_whole_elements",
            "a vector must hold at least one element of the dtype",
            lambda p, c, d: _vector_elements(p, c) >= 1,
        ),
        Constraint(
            "head_splits_into_whole_vectors",
            "each thread of a head must own a whole number of vectors",
            lambda p, c, d: _elements_per_thread(p, c) % _vector_elements(p, c) == 0
            and _elements_per_thread(p, c) >= _vector_elements(p, c),
        ),
        Constraint(
            "head_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} elements of its head",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        Constraint(
            "vectors_per_thread_unrollable",
            f"a thread may make at most {MAX_VECTORS_PER_THREAD} vector accesses per head",
            lambda p, c, d: _elements_per_thread(p, c) // _vector_elements(p, c)
            <= MAX_VECTORS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: QKNormProblem, device) -> QKNormConfig:
    """The seed heuristic: 128-bit accesses, the fewest threads per head that allows them,
    one warp per block while the warps needed fit one per SM, else 8 warps (blocks of 4-8
    warps reach the copy ceiling, blocks of 1 warp do not)."""
    vector = vector_elements(problem.dtype, 128)
    threads_per_head = min(WARP, problem.head_dim // vector)
    heads_per_warp = WARP // threads_per_head
    heads = problem.num_tokens * (problem.q_heads + problem.kv_heads)
    warps_needed = math.ceil(heads / heads_per_warp)
    warps = 1 if warps_needed <= device.sm_count else 8
    return QKNormConfig(128, heads_per_warp, warps)


def _blocks(problem: QKNormProblem, config: QKNormConfig) -> int:
    heads_per_block = config.warps_per_block * config.heads_per_warp
    return (math.ceil(problem.num_tokens * problem.q_heads / heads_per_block)
            + math.ceil(problem.num_tokens * problem.kv_heads / heads_per_block))


def cost(problem: QKNormProblem, config: QKNormConfig, device) -> Cost:
    elements = problem.num_tokens * (problem.q_heads + problem.kv_heads) * problem.head_dim
    element_bytes = DTYPE_BYTES[problem.dtype]
    return Cost(
        # Each head read once and written once; both weight vectors read once.
        bytes_moved=2 * elements * element_bytes + 2 * problem.head_dim * element_bytes,
        # Square, accumulate, scale by rsqrt, scale by the weight: four per element.
        flops=4 * elements,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=_elements_per_thread(problem, config) * element_bytes,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/qk_norm.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["q"], tensors["k"], tensors["q_weight"], tensors["k_weight"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, model problems


def reference(tensors: Tensors, problem: QKNormProblem) -> dict[str, torch.Tensor]:
    """fp32 per-head RMSNorm of q and k."""

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = x.float()
        inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + problem.eps)
        return (w.float() + problem.weight_bias) * (x * inv_rms)

    return {"q": norm(tensors["q"], tensors["q_weight"]),
            "k": norm(tensors["k"], tensors["k_weight"])}


def make_inputs(problem: QKNormProblem, device, generator: torch.Generator) -> Tensors:
    """q and k as views into one fused qkv projection output, the way engines call it."""
    dtype = TORCH_DTYPES[problem.dtype]
    d = problem.head_dim
    heads = problem.q_heads + 2 * problem.kv_heads
    qkv = torch.randn(problem.num_tokens, heads, d, generator=generator, device=device,
                      dtype=torch.float32).to(dtype)
    return {
        "q": qkv[:, : problem.q_heads],
        "k": qkv[:, problem.q_heads: problem.q_heads + problem.kv_heads],
        **make_weights(d, problem.dtype, problem.weight_bias, device, generator),
    }


def make_weights(head_dim: int, dtype: str, weight_bias: float, device,
                 generator: torch.Generator) -> Tensors:
    """q_weight and k_weight drawn so that the scale a norm applies, weight_bias + w, is around 1
    (standard deviation 0.5), so that a weight applied to the wrong head or element shows: a
    Gemma-style weight around 0, as those models hold it. The kernels' tolerances assume outputs
    of that size."""
    weights = (1.0 - weight_bias) + 0.5 * torch.randn(2, head_dim, generator=generator,
                                                      device=device)
    return {"q_weight": weights[0].to(TORCH_DTYPES[dtype]),
            "k_weight": weights[1].to(TORCH_DTYPES[dtype])}


def contiguous_inputs(problem: QKNormProblem, device, generator: torch.Generator) -> Tensors:
    """q and k as separate contiguous tensors: the layout the peers accept."""
    tensors = make_inputs(problem, device, generator)
    return {name: t.contiguous() for name, t in tensors.items()}


def _per_head_peer(norm_rows):
    """A peer row norm applied to q and to k viewed as (tokens * heads, head_dim): two
    launches, where ours is one."""

    def build(problem: QKNormProblem):
        norm = norm_rows(problem)

        def run(t: Tensors) -> dict[str, torch.Tensor]:
            d = problem.head_dim
            return {"q": norm(t["q"].view(-1, d), t["q_weight"]).view_as(t["q"]),
                    "k": norm(t["k"].view(-1, d), t["k_weight"]).view_as(t["k"])}
        return run

    return build


def _quack_rows(problem: QKNormProblem):
    try:
        from quack.rmsnorm import rmsnorm_fwd
    except ImportError as err:
        raise PeerUnavailable(f"quack is not installed ({err})") from None
    return lambda x, w: rmsnorm_fwd(x, w, eps=problem.eps, weight_offset=problem.weight_bias)[0]


def _liger_rows(problem: QKNormProblem):
    try:
        from liger_kernel.ops.rms_norm import rms_norm_forward
    except ImportError as err:
        raise PeerUnavailable(f"liger-kernel is not installed ({err})") from None
    # "gemma" casting computes in fp32 throughout, as ours and the reference do.
    return lambda x, w: rms_norm_forward(x, w, problem.eps, problem.weight_bias, "gemma",
                                         None)[0]


PEERS = (Peer("quack rmsnorm x2", _per_head_peer(_quack_rows)),
         Peer("liger rms_norm x2", _per_head_peer(_liger_rows)))


def problems_for_model(model: ModelShape, dtype: str) -> list[QKNormProblem]:
    if not model.qk_norm:
        raise NotApplicableError(f"model {model.name} does not normalise q and k per head, "
                                 "so qk_norm does not apply to it")
    if model.head_dim not in HEAD_DIMS:
        raise NotApplicableError(f"model {model.name} has head_dim {model.head_dim}; "
                                 f"qk_norm supports {HEAD_DIMS}")
    return [QKNormProblem(num_tokens=1, dtype=dtype, head_dim=model.head_dim,
                          q_heads=model.num_q_heads, kv_heads=model.num_kv_heads,
                          eps=model.rms_norm_eps, weight_bias=model.norm_weight_bias)]


KERNEL = register(KernelDef(
    name="qk_norm",
    description="per-head RMSNorm of q and k in one in-place launch",
    problem_type=QKNormProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.qk_norm"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("q", "k"),
    written_in_place=("q", "k"),
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    peers=PEERS,
    bench_inputs=contiguous_inputs,
))
