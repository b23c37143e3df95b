"""FP8 per-token-group quantisation of rows (fp8_group_quant), and fused with the gated
activation before it (silu_and_mul_fp8_quant): one kernel body for both.

    fp8_group_quant:         q, scales = quant(x)                      x: (tokens, W)
    silu_and_mul_fp8_quant:  q, scales = quant(silu(x[:, :W]) * x[:, W:])    x: (tokens, 2W)

q is (tokens, W) float8_e4m3fn; scales fp32, one per group of G (64 or 128) elements of a row,
as fp8_quant.py defines them (the floor, UE8M0, saturation, NaN and infinity). The fused form
quantises the activation rounded to x's dtype with silu_and_mul's instructions
(device/activation.py), so it writes what silu_and_mul followed by fp8_group_quant writes, in
one pass: x read once, no bf16 intermediate written and read back. Its SiLU's approximate exp2
and reciprocal may round a value one step of x's dtype apart from torch's: fp8_quant.check_fused
is its check against the reference, fp8_group_quant's is exact.

The kernel's `scales` tensor is the (tokens, groups) scales for row-major problems, and the
transpose of the (tokens, groups) column-major scales, (groups, tokens) with a row stride of at
least the tokens, for column-major ones (the op passes scales.t()): both are rows with a
symbolic stride to the compile.

For `cutetune bench`: the fused form's unfused chain of our own kernels (KernelDef.unfused:
silu_and_mul, then fp8_group_quant of the activation it writes, each as the plan serves it);
torch.compile of the reference is the bench's own. vLLM's and SGLang's
per_token_group_quant_fp8 would be the library peers, and neither is installed where the
benchmarks run.

Work split (device/fp8_quant.py): a group is LANES consecutive lanes, each loading
G / (VEC * LANES) vectors of it; a thread takes GROUPS_PER_THREAD groups, their loads issued
before any math; the groups are numbered row-major and dealt to the blocks' group slots in
turn, so that a warp's loads are coalesced and any token count is one compile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints
from cutetune.kernels.activation import (
    FLOPS_PER_ELEMENT,
    SILU,
    SILU_ACTS,
    SiluAndMulProblem,
    _mlp_widths,
)
from cutetune.kernels.block_limits import (
    MAX_VECTORS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES, vector_elements
from cutetune.kernels.fp8_quant import (
    FP8_DTYPE,
    QUANT_FLOPS_PER_ELEMENT,
    GroupQuantFields,
    check_exact,
    check_fused,
    empty_scales,
    quant_groups_of,
    quantize_reference,
    rounded_to,
    scales_bytes,
    with_edge_groups,
)
from cutetune.kernels.registry import (
    ChainStep,
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.space import Constraint, Param, Space

OUTPUTS = ("q", "scales")
# The unfused chain's activation (silu_and_mul's out, fp8_group_quant's x): bench_inputs' buffer.
ACTIVATION = "activation"
# Lanes of one group hold at least this many bytes of it before the amax (the seed heuristic).
MIN_BYTES_PER_LANE = 32


@dataclass(frozen=True, kw_only=True)
class GroupQuantProblem(GroupQuantFields):
    dtype: str

    @property
    def width(self) -> int:
        """The quantised row's width W."""
        raise NotImplementedError

    @property
    def activation(self) -> str | None:
        """The gated activation computed before the quantisation, or None."""
        return None


@dataclass(frozen=True, kw_only=True)
class FP8GroupQuantProblem(GroupQuantProblem):
    hidden: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_quant(self.dtype, self.hidden, "hidden")

    @property
    def width(self) -> int:
        return self.hidden


@dataclass(frozen=True, kw_only=True)
class SiluAndMulFP8QuantProblem(GroupQuantProblem):
    intermediate: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_quant(self.dtype, self.intermediate, "intermediate")

    @property
    def width(self) -> int:
        return self.intermediate

    @property
    def activation(self) -> str:
        return SILU


@dataclass(frozen=True)
class GroupQuantConfig:
    vector_bits: int
    lanes_per_group: int
    groups_per_thread: int
    warps_per_block: int
    cache_hints: str = cache_hints.NORMAL


# Decode's split (default_config): a warp per group, two bf16 (or one fp32) a load.
DECODE_CONFIG = GroupQuantConfig(vector_bits=32, lanes_per_group=32, groups_per_thread=1,
                                 warps_per_block=1)


def _vector_elements(problem: GroupQuantProblem, config: GroupQuantConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _vectors_per_lane(problem: GroupQuantProblem, config: GroupQuantConfig) -> int:
    """Vectors of one group each of its lanes loads (of gate and of up, for the fused form)."""
    return problem.group_size // (_vector_elements(problem, config) * config.lanes_per_group)


def _loads_per_thread(problem: GroupQuantProblem, config: GroupQuantConfig) -> int:
    gated = 2 if problem.activation else 1
    return gated * config.groups_per_thread * _vectors_per_lane(problem, config)


def _registers_per_thread(problem: GroupQuantProblem, config: GroupQuantConfig) -> int:
    # Every loaded vector in fp32, held from the loads to the stores.
    return estimated_registers(_loads_per_thread(problem, config)
                               * _vector_elements(problem, config))


SPACE = Space(
    config_type=GroupQuantConfig,
    params=(
        Param("vector_bits", (32, 64, 128), "bits of x per thread per global load (the FP8 "
              "stores are a quarter or half as wide)"),
        Param("lanes_per_group", (1, 2, 4, 8, 16, 32),
              "consecutive lanes sharing one group: its amax takes log2 of them shuffles"),
        Param("groups_per_thread", (1, 2, 4),
              "groups a thread loads before its first amax (ILP across groups)"),
        Param("warps_per_block", (1, 2, 4, 8), "warps in one thread block"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "group_splits_among_lanes",
            "a group must be a whole number of vectors for each of its lanes (group_size a "
            "multiple of vector elements x lanes_per_group)",
            lambda p, c, d: p.group_size % (_vector_elements(p, c) * c.lanes_per_group) == 0,
        ),
        Constraint(
            "loads_per_thread_unrollable",
            f"a thread may make at most {MAX_VECTORS_PER_THREAD} vector loads (unrolled)",
            lambda p, c, d: _loads_per_thread(p, c) <= MAX_VECTORS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


SEED_VECTOR_BITS = 128  # the seed heuristic's loads


def seed_lanes_per_group(group_size: int, dtype: str) -> int:
    """The seed heuristic's lanes a group: each holding MIN_BYTES_PER_LANE of it in
    SEED_VECTOR_BITS vectors, at least one vector a lane (8 lanes for a group of 128 bf16)."""
    lanes = max(1, group_size * DTYPE_BYTES[dtype] // MIN_BYTES_PER_LANE)
    return min(lanes, group_size // vector_elements(dtype, SEED_VECTOR_BITS))


def default_config(problem: GroupQuantProblem, device) -> GroupQuantConfig:
    """The seed heuristic: 128-bit loads, each lane holding MIN_BYTES_PER_LANE of its group
    (two vectors: a group of 128 bf16 on 8 lanes), one group per thread; then the largest
    block of 8 or 4 warps that still gives every SM a block. Where not even that many threads
    are wanted (decode), a whole warp per group with 32-bit loads (DECODE_CONFIG): a call then
    takes the latency of one thread's share, and four elements a lane quantise in half the
    time of sixteen (tuned on an H100 at one token of each DeepSeek-V3 width, this split took
    1.97-1.99 us where the 128-bit split took 3.75)."""
    lanes = seed_lanes_per_group(problem.group_size, problem.dtype)
    threads_needed = problem.num_tokens * (problem.width // problem.group_size) * lanes
    warps = next((w for w in (8, 4) if threads_needed >= w * WARP * device.sm_count), None)
    if warps is None:
        return DECODE_CONFIG
    return GroupQuantConfig(SEED_VECTOR_BITS, lanes, 1, warps)


def _blocks(problem: GroupQuantProblem, config: GroupQuantConfig) -> int:
    groups = problem.num_tokens * (problem.width // problem.group_size)
    per_block = config.warps_per_block * WARP // config.lanes_per_group * config.groups_per_thread
    return math.ceil(groups / per_block)


def cost(problem: GroupQuantProblem, config: GroupQuantConfig, device) -> Cost:
    elements = problem.num_tokens * problem.width
    gated = 2 if problem.activation else 1
    activation_flops = FLOPS_PER_ELEMENT[problem.activation] if problem.activation else 0
    return Cost(
        # x (gate and up) read once; q (one byte an element) and the scales written once.
        bytes_moved=gated * elements * DTYPE_BYTES[problem.dtype] + elements
        + scales_bytes(problem.num_tokens, problem.width, problem.group_size),
        flops=(QUANT_FLOPS_PER_ELEMENT + activation_flops) * elements,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=_loads_per_thread(problem, config) * config.vector_bits // 8,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/fp8_quant.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["q"], tensors["scales"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, check, peers, model problems


def quantized_values(tensors: Tensors, problem: GroupQuantProblem) -> torch.Tensor:
    """What the kernel quantises, in fp32: x, or the activation rounded to x's dtype."""
    x = tensors["x"].float()
    if problem.activation is None:
        return x
    gate, up = x[:, : problem.width], x[:, problem.width:]
    return rounded_to(torch.nn.functional.silu(gate) * up, TORCH_DTYPES[problem.dtype])


def kernel_scales(scales: torch.Tensor, column_major: bool) -> torch.Tensor:
    """(tokens, groups) scales as the kernel's `scales` tensor holds them: transposed for
    column-major problems."""
    return scales.t() if column_major else scales


def reference(tensors: Tensors, problem: GroupQuantProblem) -> dict[str, torch.Tensor]:
    q, scales = quantize_reference(quantized_values(tensors, problem), problem.group_size,
                                   problem.ue8m0)
    return {"q": q, "scales": kernel_scales(scales, problem.column_major_scales)}


def check(outputs: Tensors, expected, problem: GroupQuantProblem) -> None:
    """fp8_group_quant's outputs exactly (the amax, the scale, its reciprocal, the products and the
    conversion are correctly rounded operations on both sides); the fused form's within one rounding
    step of its activation (fp8_quant.check_fused)."""
    if problem.activation is None:
        check_exact(outputs, expected, OUTPUTS)
    else:
        check_fused(outputs, expected, problem.dtype)


def make_inputs(problem: GroupQuantProblem, device, generator: torch.Generator) -> Tensors:
    """x about N(0, 1) times a per-row magnitude from 2^-8 to 2^8 (groups of very different
    scales; 2^-4 to 2^4 for the fused form), with edge-case groups (fp8_quant.with_edge_groups); q
    allocated; the scales in the op's layout, TMA-padded when column-major."""
    dtype = TORCH_DTYPES[problem.dtype]
    tokens = problem.num_tokens
    in_width = (2 if problem.activation else 1) * problem.width
    # The fused form's products square the magnitude: 2^-4 to 2^4 keeps them within fp16.
    spread = 4 if problem.activation else 8
    magnitude = torch.exp2(torch.randint(-spread, spread + 1, (tokens, 1), generator=generator,
                                         device=device).float())
    x = magnitude * torch.randn(tokens, in_width, generator=generator, device=device)
    # The edge groups go into x, or into up (a zero up makes a zero product, whatever the
    # gate).
    edges = x[:, problem.width:] if problem.activation else x
    edges.copy_(with_edge_groups(edges.clone(), problem.group_size, generator))
    groups = problem.width // problem.group_size
    scales = empty_scales(tokens, groups, problem.column_major_scales, device)
    return {"x": x.to(dtype),
            "q": torch.empty(tokens, problem.width, dtype=FP8_DTYPE, device=device),
            "scales": kernel_scales(scales, problem.column_major_scales)}


def quant_problem(problem, width: int) -> FP8GroupQuantProblem:
    """fp8_group_quant's problem for the rows of `width` that a fused FP8 problem (one with
    the quantisation's fields and a dtype) quantises: its unfused chain's last step."""
    return FP8GroupQuantProblem(num_tokens=problem.num_tokens, dtype=problem.dtype, hidden=width,
                                group_size=problem.group_size,
                                column_major_scales=problem.column_major_scales,
                                ue8m0=problem.ue8m0)


def with_chain_buffer(make_inputs, name: str, width_of):
    """bench_inputs of a fused kernel: its make_inputs plus the buffer `name`, (tokens,
    width_of(problem)) in x's dtype, that its unfused chain's first step writes (allocated
    per call, as every output is) and its quantisation reads."""

    def bench_inputs(problem, device, generator: torch.Generator) -> Tensors:
        tensors = dict(make_inputs(problem, device, generator))
        tensors[name] = torch.empty(problem.num_tokens, width_of(problem),
                                    dtype=TORCH_DTYPES[problem.dtype], device=device)
        return tensors

    return bench_inputs


# silu_and_mul writes the activation in x's dtype (what the fused form quantises, rounded so),
# and fp8_group_quant quantises it: the chain's q and scales are the fused kernel's.
SILU_CHAIN = (
    ChainStep("silu_and_mul", lambda p: SiluAndMulProblem(
        num_tokens=p.num_tokens, dtype=p.dtype, intermediate=p.intermediate),
        names={"out": ACTIVATION}),
    ChainStep("fp8_group_quant", lambda p: quant_problem(p, p.intermediate),
              names={"x": ACTIVATION}),
)


def quant_problems_for_model(model: ModelShape, dtype: str) -> list[FP8GroupQuantProblem]:
    """The rows a model with FP8 group-quantised activations quantises on their own, where no
    norm or activation before them is fused with the quantisation: the hidden size (the
    inputs of the attention and MLP projections), attention's output (q heads x head dim, or
    under MLA q heads x v_head_dim: o_proj's input) and each MLP width (down_proj's input).
    Column-major scales, the layout the block-scaled GEMMs of Hopper read; powers of two where
    the model's scale_fmt says ue8m0."""
    group, ue8m0 = quant_groups_of(model, "fp8_group_quant")
    attention = (model.mla.q_heads * model.mla.value_head_dim if model.mla is not None
                 else model.num_q_heads * model.head_dim)
    widths = [model.hidden_size, attention, *_mlp_widths(model, "fp8_group_quant")]
    return [FP8GroupQuantProblem(num_tokens=1, dtype=dtype, hidden=w, group_size=group,
                                 column_major_scales=True, ue8m0=ue8m0)
            for w in dict.fromkeys(w for w in widths if w and w % group == 0)]


def silu_problems_for_model(model: ModelShape, dtype: str) -> list[SiluAndMulFP8QuantProblem]:
    """Each SwiGLU MLP width of a model with FP8 group-quantised activations (down_proj reads
    the activation quantised)."""
    group, ue8m0 = quant_groups_of(model, "silu_and_mul_fp8_quant")
    if model.hidden_act not in SILU_ACTS:
        raise NotApplicableError(f"model {model.name} uses the activation "
                                 f"{model.hidden_act!r}; silu_and_mul_fp8_quant computes silu")
    return [SiluAndMulFP8QuantProblem(num_tokens=1, dtype=dtype, intermediate=w,
                                      group_size=group, column_major_scales=True, ue8m0=ue8m0)
            for w in _mlp_widths(model, "silu_and_mul_fp8_quant") if w % group == 0]


def _kernel_def(name: str, description: str, problem_type: type[GroupQuantProblem],
                problems_for_model, unfused: tuple[ChainStep, ...] = (),
                bench_inputs=None) -> KernelDef:
    return KernelDef(
        name=name,
        description=description,
        problem_type=problem_type,
        space=SPACE,
        problems_for_model=problems_for_model,
        default_config=default_config,
        cost=cost,
        compile_function=DeviceCompile("cutetune.kernels.device.fp8_quant"),
        launch=launch,
        make_inputs=make_inputs,
        reference=reference,
        outputs=OUTPUTS,
        written_in_place=(),
        tolerance={"float32": (0.0, 0.0)},
        source_file=__file__,
        check=check,
        unfused=unfused,
        bench_inputs=bench_inputs,
    )


QUANT_KERNEL = register(_kernel_def(
    "fp8_group_quant", "FP8 (e4m3) quantisation with one fp32 scale per group of a row",
    FP8GroupQuantProblem, quant_problems_for_model))
SILU_QUANT_KERNEL = register(_kernel_def(
    "silu_and_mul_fp8_quant", "SwiGLU of a fused gate-up row, quantised to FP8 per group",
    SiluAndMulFP8QuantProblem, silu_problems_for_model, SILU_CHAIN,
    with_chain_buffer(make_inputs, ACTIVATION, lambda p: p.intermediate)))
