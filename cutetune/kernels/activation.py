"""Gated activations of an MLP: silu_and_mul and gelu_and_mul, one kernel body for both.

    out[t, i] = act(x[t, i]) * x[t, I + i]        x: (tokens, 2 * I), out: (tokens, I)

x is the fused gate-up projection (gate in the first half of each row, up in the second), the
layout engines produce with one GEMM. act is SiLU, or GELU in its erf form ("none") or its
tanh form ("tanh") as in torch.nn.functional.gelu; it is a compile-time choice, so each kernel
holds only its own math. Computed in fp32, stored in the input dtype. SiLU and tanh-GELU are
x * sigmoid(.), with ex2.approx and rcp.approx (accurate to about 1e-6, inside fp32's
tolerance); erf-GELU uses libdevice's erff.

Work split: a row is I / VEC vectors; the vectors of all rows are numbered row-major and a block
takes THREADS * VECTORS_PER_THREAD consecutive numbers, thread `tid` the numbers tid,
tid + THREADS, ... so each load instruction of a warp is coalesced. A block may straddle rows,
so any I that the vector divides works, and only the last block has a tail, guarded per
vector. The token count and both row strides are dynamic, so one compile serves every call.

The config's cache_hints (cache_hints.py) chooses plain or streaming (evict-first) loads of x and
stores of out; the tuner picks per shape.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import (
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
    widest_vector_bits,
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

# The seed heuristic gives a thread at least this many bits of gate (and as many of up) to load
# before it waits. The space also holds narrower vectors and fewer bits per thread: a small call
# spread over more threads and SMs can finish sooner.
MIN_BITS_PER_THREAD = 128
GELU_FORMS = ("none", "tanh")
# The compile-time activation names the kernel body branches on.
SILU, GELU_ERF, GELU_TANH = "silu", "gelu_none", "gelu_tanh"
# FP32 operations per output element, counting a transcendental as one: SiLU is a scale, exp,
# add, reciprocal and two multiplies; tanh-GELU adds the cubic (square, fma, multiply); erf-GELU
# is libdevice's erff (about seven fmas and an exp) plus the scale and multiplies.
FLOPS_PER_ELEMENT = {SILU: 6, GELU_TANH: 9, GELU_ERF: 13}
LOG2_E = math.log2(math.e)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
# tanh-GELU as x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3): 2z = x * (K1 + K3 x^2).
GELU_TANH_K1 = 2.0 * math.sqrt(2.0 / math.pi)
GELU_TANH_K3 = 2.0 * math.sqrt(2.0 / math.pi) * 0.044715


@dataclass(frozen=True, kw_only=True)
class GatedProblem(Problem):
    """What both gated activations fix: the dtype and the intermediate width I (x is 2I wide)."""

    dtype: str
    intermediate: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use {', '.join(TORCH_DTYPES)}")
        if (not isinstance(self.intermediate, int) or isinstance(self.intermediate, bool)
                or self.intermediate < 1):
            raise ValueError(f"intermediate must be a positive integer, got "
                             f"{self.intermediate!r}")

    @property
    def activation(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class SiluAndMulProblem(GatedProblem):
    @property
    def activation(self) -> str:
        return SILU


@dataclass(frozen=True, kw_only=True)
class GeluAndMulProblem(GatedProblem):
    approximate: str  # as torch.nn.functional.gelu: "none" (erf) or "tanh"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.approximate not in GELU_FORMS:
            raise ValueError(f"approximate must be one of {GELU_FORMS}, got "
                             f"{self.approximate!r}")

    @property
    def activation(self) -> str:
        return GELU_ERF if self.approximate == "none" else GELU_TANH


@dataclass(frozen=True)
class ActivationConfig:
    vector_bits: int
    vectors_per_thread: int
    warps_per_block: int
    # Stored winners that lack this field are points of plain accesses.
    cache_hints: str = cache_hints.NORMAL


def _vector_elements(problem: GatedProblem, config: ActivationConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _vectors_per_block(config: ActivationConfig) -> int:
    return config.warps_per_block * WARP * config.vectors_per_thread


def _registers_per_thread(problem: GatedProblem, config: ActivationConfig) -> int:
    # The gate and up vectors of every access in fp32, loaded before the first store.
    return estimated_registers(2 * config.vectors_per_thread * _vector_elements(problem, config))


def _widest_vector_bits(problem: GatedProblem) -> int:
    """128 when I allows it, else the widest vector that divides I (0: none does)."""
    return widest_vector_bits(problem.dtype, problem.intermediate)


SPACE = Space(
    config_type=ActivationConfig,
    params=(
        Param("vector_bits", (32, 64, 128), "bits per thread per global access"),
        Param("vectors_per_thread", (1, 2, 4),
              "vectors of gate and of up a thread loads before its first store (ILP)"),
        # 1 warp: the decode variant, one small block on each of many SMs. 2-warp blocks hold
        # what 1 warp with 2 vectors per thread holds; 8 warps already fill an SM with 8
        # blocks, so 16 and 32 only coarsen the tail (and the compile sweep).
        Param("warps_per_block", (1, 4, 8), "warps in one thread block"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "intermediate_splits_into_vectors",
            "the intermediate width must be a whole number of vectors (so the up half and "
            "every row start on a vector boundary)",
            lambda p, c, d: p.intermediate % _vector_elements(p, c) == 0,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: GatedProblem, device) -> ActivationConfig:
    """The seed heuristic: 128-bit accesses (or the widest vector that divides I), as many
    vectors per thread as the 16-byte minimum asks (one at 128 bits); then the largest block
    of 8 or 4 warps that still gives every SM a block, else one warp per block (decode).
    Blocks of 4-8 warps reach the copy ceiling, blocks of 1 warp do not."""
    bits = _widest_vector_bits(problem)
    if not bits:
        # No vector divides I: let the space say which constraint removed every point.
        SPACE.valid_points(problem, device)
    per_thread = MIN_BITS_PER_THREAD // bits
    vectors = problem.num_tokens * problem.intermediate // vector_elements(problem.dtype, bits)
    threads_needed = math.ceil(vectors / per_thread)
    warps = next((w for w in (8, 4) if threads_needed >= w * WARP * device.sm_count), 1)
    return ActivationConfig(bits, per_thread, warps)


def _blocks(problem: GatedProblem, config: ActivationConfig) -> int:
    vectors = problem.num_tokens * problem.intermediate // _vector_elements(problem, config)
    return math.ceil(vectors / _vectors_per_block(config))


def cost(problem: GatedProblem, config: ActivationConfig, device) -> Cost:
    elements = problem.num_tokens * problem.intermediate
    element_bytes = DTYPE_BYTES[problem.dtype]
    return Cost(
        # Gate and up read once, out written once.
        bytes_moved=3 * elements * element_bytes,
        flops=FLOPS_PER_ELEMENT[problem.activation] * elements,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=2 * config.vectors_per_thread * config.vector_bits // 8,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/activation.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["out"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, peers, model problems


def _torch_activation(gate: torch.Tensor, problem: GatedProblem) -> torch.Tensor:
    if problem.activation == SILU:
        return torch.nn.functional.silu(gate)
    return torch.nn.functional.gelu(gate, approximate=problem.approximate)


def reference(tensors: Tensors, problem: GatedProblem) -> dict[str, torch.Tensor]:
    """fp32 act(gate) * up."""
    x = tensors["x"].float()
    gate, up = x[:, : problem.intermediate], x[:, problem.intermediate:]
    return {"out": _torch_activation(gate, problem) * up}


def make_inputs(problem: GatedProblem, device, generator: torch.Generator) -> Tensors:
    """x as one contiguous gate-up projection output; out allocated (the verifier poisons it).
    Spread 2x wider than N(0, 1), so the activation's saturated tails are exercised too."""
    dtype = TORCH_DTYPES[problem.dtype]
    x = 2.0 * torch.randn(problem.num_tokens, 2 * problem.intermediate, generator=generator,
                          device=device, dtype=torch.float32)
    return {"x": x.to(dtype),
            "out": torch.empty(problem.num_tokens, problem.intermediate, dtype=dtype,
                               device=device)}


def bench_inputs(problem: GatedProblem, device, generator: torch.Generator) -> Tensors:
    """make_inputs plus contiguous copies of the two halves, `gate` and `up`: the layout of
    liger's two-tensor ops (models that project gate and up with separate GEMMs)."""
    tensors = dict(make_inputs(problem, device, generator))
    x = tensors["x"]
    tensors["gate"] = x[:, : problem.intermediate].contiguous()
    tensors["up"] = x[:, problem.intermediate:].contiguous()
    return tensors


def _liger(module: str, name: str):
    try:
        imported = importlib.import_module(f"liger_kernel.ops.{module}")
    except ImportError as err:
        raise PeerUnavailable(f"liger-kernel is not installed ({err})") from None
    function = getattr(imported, name, None)
    if function is None:
        raise PeerUnavailable(f"this liger-kernel has no ops.{module}.{name}")
    return function


def _liger_swiglu_fused(problem: GatedProblem):
    forward = _liger("swiglu", "swiglu_fused_gate_up_forward")
    return lambda t: {"out": forward(t["x"])[1]}


def _liger_swiglu(problem: GatedProblem):
    forward = _liger("swiglu", "swiglu_forward")
    return lambda t: {"out": forward(t["gate"], t["up"])[2]}


def _liger_geglu(problem: GeluAndMulProblem):
    if problem.approximate != "tanh":
        raise PeerUnavailable("liger's geglu computes the tanh form of GELU only")
    forward = _liger("geglu", "geglu_forward")
    return lambda t: {"out": forward(t["gate"], t["up"])[2]}


def _mlp_widths(model: ModelShape, kernel: str) -> list[int]:
    """The intermediate widths of the MLPs the model runs (dense, routed experts, shared
    experts), each once."""
    widths = [w for w in (model.intermediate_size, model.expert_intermediate,
                          model.shared_expert_intermediate) if w]
    if not widths:
        raise NotApplicableError(f"model {model.name} declares no MLP width "
                                 f"(intermediate_size or expert_intermediate), so {kernel} "
                                 "has nothing to do for it")
    return list(dict.fromkeys(widths))


# Hugging Face's activation names, by the kernel (and GELU form) that computes them.
SILU_ACTS = ("silu", "swish")
GELU_FORM_OF_ACT = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh",
                    "gelu_fast": "tanh"}


def _check_activation(model: ModelShape, kernel: str, accepted) -> None:
    if model.hidden_act not in accepted:
        raise NotApplicableError(f"model {model.name} uses the activation "
                                 f"{model.hidden_act!r}; {kernel} computes "
                                 f"{', '.join(accepted)}")


def silu_problems_for_model(model: ModelShape, dtype: str) -> list[SiluAndMulProblem]:
    _check_activation(model, "silu_and_mul", SILU_ACTS)
    return [SiluAndMulProblem(num_tokens=1, dtype=dtype, intermediate=w)
            for w in _mlp_widths(model, "silu_and_mul")]


def gelu_problems_for_model(model: ModelShape, dtype: str) -> list[GeluAndMulProblem]:
    _check_activation(model, "gelu_and_mul", tuple(GELU_FORM_OF_ACT))
    return [GeluAndMulProblem(num_tokens=1, dtype=dtype, intermediate=w,
                              approximate=GELU_FORM_OF_ACT[model.hidden_act])
            for w in _mlp_widths(model, "gelu_and_mul")]


def _kernel_def(name: str, description: str, problem_type: type[GatedProblem],
                problems_for_model, peers: tuple[Peer, ...], other: str) -> KernelDef:
    """The two kernels differ in their math (a compile-time field of the problem), their
    model problems and their peers; everything else is shared, so each borrows the `other`'s
    winners (its points are the same loads and stores)."""
    return KernelDef(
        name=name,
        description=description,
        problem_type=problem_type,
        space=SPACE,
        problems_for_model=problems_for_model,
        default_config=default_config,
        cost=cost,
        compile_function=DeviceCompile("cutetune.kernels.device.activation"),
        launch=launch,
        make_inputs=make_inputs,
        reference=reference,
        outputs=("out",),
        written_in_place=(),
        tolerance=FLOAT_TOLERANCE,
        source_file=__file__,
        peers=peers,
        bench_inputs=bench_inputs,
        borrows_from=(other,),
    )


SILU_KERNEL = register(_kernel_def(
    "silu_and_mul", "SwiGLU: silu(gate) * up of a fused gate-up row",
    SiluAndMulProblem, silu_problems_for_model,
    (Peer("liger swiglu fused gate-up", _liger_swiglu_fused),
     Peer("liger swiglu (gate, up)", _liger_swiglu)), "gelu_and_mul"))
GELU_KERNEL = register(_kernel_def(
    "gelu_and_mul", "GeGLU: gelu(gate) * up of a fused gate-up row (erf or tanh form)",
    GeluAndMulProblem, gelu_problems_for_model,
    (Peer("liger geglu (gate, up)", _liger_geglu),), "silu_and_mul"))
