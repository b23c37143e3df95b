"""RMSNorm, optionally after the residual add, quantised to FP8 per group, in one pass.

    residual += x (fused_add);  v = rmsnorm(residual or x) in x's dtype;  q, scales = quant(v)

The norm is rmsnorm's (vLLM's fused_add_rms_norm contract: the sum rounded to x's dtype, stored
into `residual` in place, and normalised); the normalised row is rounded to x's dtype and
quantised as fp8_quant.py defines it, so the kernel writes what rmsnorm (or fused_add_rmsnorm)
at the same config followed by fp8_group_quant writes, with x and the residual read once, and
neither the normalised row written nor read back. Against the fp32 reference (or rmsnorm at
another config, whose sum of squares is reduced in another order) a value may round to x's
dtype one step apart: fp8_quant.check_fused is its check. The scales' layouts are
fp8_group_quant's (the kernel's `scales` is the transpose of column-major scales).

Forms and work split are rmsnorm's (block_per_row: a row's threads span the block's warps;
warp_per_row: a warp per row), with the groups laid over them: the row's threads own its
vectors lane, lane + THREADS, ..., so a group of G / VEC vectors sits on that many consecutive
lanes of one warp (at most 32, the space's constraint), whose amax their shuffles take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints, rmsnorm
from cutetune.kernels.block_limits import (
    MAX_ELEMENTS_PER_THREAD,
    MAX_VECTORS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, FLOAT_TOLERANCE, TORCH_DTYPES, vector_elements
from cutetune.kernels.fp8_group_quant import kernel_scales, quant_problem, with_chain_buffer
from cutetune.kernels.fp8_quant import (
    FP8_DTYPE,
    QUANT_FLOPS_PER_ELEMENT,
    GroupQuantFields,
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
    Tensors,
    compare,
    register,
)
from cutetune.kernels.rmsnorm import (
    BLOCK_PER_ROW,
    MAX_HIDDEN,
    WARP_PER_ROW,
    RMSNormConfig,
    RMSNormProblem,
)
from cutetune.kernels.rmsnorm import reference as rmsnorm_reference
from cutetune.spaces.models import ModelShape
from cutetune.spaces.space import Constraint, Param, Space

OUTPUTS = ("q", "scales", "residual")
# The unfused chain's normalised row (rmsnorm's out, fp8_group_quant's x): bench_inputs' buffer.
NORMED = "normed"
# The seed heuristic's vectors per thread of a block_per_row row (rmsnorm's).
TARGET_VECTORS_PER_THREAD = 4


@dataclass(frozen=True, kw_only=True)
class RMSNormFP8QuantProblem(GroupQuantFields):
    dtype: str
    hidden: int
    eps: float
    weight_bias: float
    fused_add: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_quant(self.dtype, self.hidden, "hidden")
        if self.hidden > MAX_HIDDEN:
            raise ValueError(f"hidden {self.hidden} not supported: at most {MAX_HIDDEN}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.weight_bias not in (0.0, 1.0):
            raise ValueError(f"weight_bias must be 0 or 1 (Gemma-style), got {self.weight_bias}")
        if not isinstance(self.fused_add, bool):
            raise ValueError(f"fused_add must be a bool, got {self.fused_add!r}")

    @property
    def norm(self) -> RMSNormProblem:
        """The norm this kernel computes, as rmsnorm states it."""
        return self.norm_problem(self.fused_add)

    def norm_problem(self, fused_add: bool) -> RMSNormProblem:
        """The RMSNorm this quantises the output of, written in x's dtype."""
        return RMSNormProblem(num_tokens=self.num_tokens, dtype=self.dtype, out_dtype=self.dtype,
                              hidden=self.hidden, eps=self.eps, weight_bias=self.weight_bias,
                              fused_add=fused_add)


# The row's split over threads is rmsnorm's, of the norm this quantises the output of (written
# in x's dtype, so its vectors are x's).
def _vector_elements(problem: RMSNormFP8QuantProblem, config: RMSNormConfig) -> int:
    return rmsnorm._vector_elements(problem.norm, config)


def _vectors_per_row(problem: RMSNormFP8QuantProblem, config: RMSNormConfig) -> int:
    return rmsnorm._vectors_per_row(problem.norm, config)


def _vectors_per_thread(problem: RMSNormFP8QuantProblem, config: RMSNormConfig) -> int:
    return rmsnorm._vectors_per_thread(problem.norm, config)


def _elements_per_thread(problem: RMSNormFP8QuantProblem, config: RMSNormConfig) -> int:
    return rmsnorm._elements_per_thread(problem.norm, config)


def _registers_per_thread(problem: RMSNormFP8QuantProblem, config: RMSNormConfig) -> int:
    return rmsnorm._registers_per_thread(problem.norm, config)


SPACE = Space(
    config_type=RMSNormConfig,
    params=(
        Param("form", (BLOCK_PER_ROW, WARP_PER_ROW),
              "one block per row (cross-warp reduction) or one warp per row (shuffles only)"),
        Param("vector_bits", (32, 64, 128), "bits of x per thread per global load"),
        Param("warps_per_block", (1, 2, 4, 8, 16, 32),
              "warps in one thread block: a row's warps (block_per_row) or its rows "
              "(warp_per_row)"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "group_within_a_warp",
            "a group's vectors (one per lane) must fit one warp: group_size / vector elements "
            "at most 32",
            lambda p, c, d: p.group_size // _vector_elements(p, c) <= WARP,
        ),
        Constraint(
            "no_idle_threads",
            "every thread of a row must own at least one vector (no more threads per row "
            "than vectors in it)",
            lambda p, c, d: rmsnorm._threads_per_row(c) <= _vectors_per_row(p, c),
        ),
        Constraint(
            "row_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} elements of its row",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        Constraint(
            "vectors_per_thread_unrollable",
            f"a thread may make at most {MAX_VECTORS_PER_THREAD} vector accesses per tensor",
            lambda p, c, d: _vectors_per_thread(p, c) <= MAX_VECTORS_PER_THREAD,
        ),
        block_size_within_device(),
        block_fits_register_file(_registers_per_thread),
    ),
)


def default_config(problem: RMSNormFP8QuantProblem, device) -> RMSNormConfig:
    """The seed heuristic, rmsnorm's: 128-bit loads; a row of at most 4 vectors per lane of
    one warp gets warp_per_row (one warp per block while the rows fit one per SM, else 8 rows
    per block); a larger row a block of the power-of-two warps nearest to 4 vectors per
    thread. Falls back to the nearest valid point."""
    enumeration = SPACE.enumerate(problem, device)
    enumeration.raise_if_empty(problem.describe())
    vectors = problem.hidden // vector_elements(problem.dtype, 128)
    if vectors <= WARP * TARGET_VECTORS_PER_THREAD:
        form = WARP_PER_ROW
        warps = 1 if problem.num_tokens <= device.sm_count else 8
    else:
        form = BLOCK_PER_ROW
        warps = 1 << max(0, round(math.log2(vectors / (WARP * TARGET_VECTORS_PER_THREAD))))
    preferred = RMSNormConfig(form, 128, warps, cache_hints.NORMAL)
    if preferred in enumeration.valid:
        return preferred

    def distance(c: RMSNormConfig) -> tuple:
        return (c.vector_bits != 128, c.form != form,
                abs(math.log2(c.warps_per_block) - math.log2(warps)), -c.warps_per_block,
                c.cache_hints != cache_hints.NORMAL)

    return min(enumeration.valid, key=distance)


def cost(problem: RMSNormFP8QuantProblem, config: RMSNormConfig, device) -> Cost:
    elements = problem.num_tokens * problem.hidden
    in_bytes = DTYPE_BYTES[problem.dtype]
    # x read; the fused add reads and writes the residual; the weight once; q and the scales
    # written.
    moved = (elements * (in_bytes + (2 * in_bytes if problem.fused_add else 0) + 1)
             + problem.hidden * in_bytes
             + scales_bytes(problem.num_tokens, problem.hidden, problem.group_size))
    return Cost(
        bytes_moved=moved,
        flops=((5 if problem.fused_add else 4) + QUANT_FLOPS_PER_ELEMENT) * elements,
        blocks=-(-problem.num_tokens // rmsnorm._rows_per_block(config)),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        smem_per_block=4 * config.warps_per_block if (
            config.form == BLOCK_PER_ROW and config.warps_per_block > 1) else 0,
        bytes_in_flight_per_thread=_elements_per_thread(problem, config) * in_bytes
        * (2 if problem.fused_add else 1),
    )


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["residual"], tensors["weight"], tensors["q"],
             tensors["scales"])


def reference(tensors: Tensors, problem: RMSNormFP8QuantProblem) -> dict[str, torch.Tensor]:
    """rmsnorm's reference of the row (the residual sum rounded to x's dtype, by rounded_to,
    which torch.compile keeps), written in x's dtype, then quantised; `residual` as rmsnorm's
    (the fp32 sum)."""
    dtype = TORCH_DTYPES[problem.dtype]
    row = tensors["x"].float()
    residual = tensors["residual"].float()
    if problem.fused_add:
        residual = row + residual
        row = rounded_to(residual, dtype)
    normed = rmsnorm_reference({"x": row, "residual": row, "weight": tensors["weight"]},
                               problem.norm_problem(fused_add=False))
    q, scales = quantize_reference(rounded_to(normed["out"], dtype), problem.group_size,
                                   problem.ue8m0)
    return {"q": q, "scales": kernel_scales(scales, problem.column_major_scales),
            "residual": residual}


def check(outputs: Tensors, expected, problem: RMSNormFP8QuantProblem) -> None:
    """q and the scales within one rounding step of the normalised row (fp8_quant.check_fused:
    its sum of squares is reduced in another order than torch's); the residual sum within the
    input dtype's tolerance."""
    check_fused(outputs, expected, problem.dtype)
    compare("residual", outputs["residual"], expected["residual"],
            *FLOAT_TOLERANCE[problem.dtype])


def make_inputs(problem: RMSNormFP8QuantProblem, device, generator: torch.Generator) -> Tensors:
    """rmsnorm's inputs (x and the residual about N(0, 1), the weight about 1 +- 0.5), with
    edge-case groups in the weight: a zero group of the weight makes that group of every row
    zero, a tiny one puts it below the amax floor."""
    dtype = TORCH_DTYPES[problem.dtype]
    shape = (problem.num_tokens, problem.hidden)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device=device, dtype=torch.float32)

    weight = with_edge_groups((1.0 + 0.5 * randn(1, problem.hidden)), problem.group_size,
                              generator)
    scales = empty_scales(problem.num_tokens, problem.hidden // problem.group_size,
                          problem.column_major_scales, device)
    return {
        "x": randn(*shape).to(dtype),
        "residual": randn(*shape).to(dtype),
        "weight": weight.reshape(problem.hidden).to(dtype),
        "q": torch.empty(shape, dtype=FP8_DTYPE, device=device),
        "scales": kernel_scales(scales, problem.column_major_scales),
    }


# rmsnorm (its fused add where the problem's is: the residual summed in place) writes the
# normalised row in x's dtype (what the fused kernel quantises, rounded so), and fp8_group_quant
# quantises it: the chain's q, scales and residual are the fused kernel's.
UNFUSED = (
    ChainStep("rmsnorm", lambda p: p.norm_problem(fused_add=p.fused_add), names={"out": NORMED}),
    ChainStep("fp8_group_quant", lambda p: quant_problem(p, p.hidden), names={"x": NORMED}),
)


def problems_for_model(model: ModelShape, dtype: str) -> list[RMSNormFP8QuantProblem]:
    """The norms whose output a model with FP8 group-quantised activations feeds to quantised
    projections: the hidden size plain (the first layer's input norm) and after the residual
    add (every other layer's two norms), and each extra width plain (DeepSeek-V3's q and kv
    low-rank norms, read by q_b_proj and kv_b_proj); column-major scales, as
    fp8_group_quant's problems."""
    group, ue8m0 = quant_groups_of(model, "rmsnorm_fp8_quant")
    extra_eps = model.extra_norm_eps or model.rms_norm_eps

    def problem(hidden: int, fused_add: bool, eps: float) -> RMSNormFP8QuantProblem:
        return RMSNormFP8QuantProblem(
            num_tokens=1, dtype=dtype, hidden=hidden, eps=eps,
            weight_bias=model.norm_weight_bias, fused_add=fused_add, group_size=group,
            column_major_scales=True, ue8m0=ue8m0)

    norms = [(model.hidden_size, False, model.rms_norm_eps),
             (model.hidden_size, True, model.rms_norm_eps),
             *((width, False, extra_eps) for width in model.extra_norm_widths)]
    return [problem(*norm) for norm in norms if norm[0] % group == 0]


KERNEL = register(KernelDef(
    name="rmsnorm_fp8_quant",
    description="RMSNorm (optionally after the residual add) quantised to FP8 per group",
    problem_type=RMSNormFP8QuantProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.rmsnorm_fp8_quant"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=OUTPUTS,
    written_in_place=("residual",),
    tolerance={"float32": (0.0, 0.0), **FLOAT_TOLERANCE},
    source_file=__file__,
    check=check,
    unfused=UNFUSED,
    bench_inputs=with_chain_buffer(make_inputs, NORMED, lambda p: p.hidden),
))
