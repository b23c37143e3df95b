"""MoE dispatch writing FP8 rows and their scales: moe_dispatch's routing and layout, with each
token's row quantised on its way to its experts' segments.

    counts, offsets, row_of, error = moe_dispatch's (moe_common's layout)
    q, scales = quant(dispatched)                     as fp8_group_quant quantises the rows

q is (capacity, hidden) float8_e4m3fn, scales fp32 (capacity, hidden / group_size), row-major
or column-major (the kernel's `scales` is the transpose of column-major scales, as
fp8_group_quant's): a grouped FP8 GEMM reads each expert's segment and its scales directly.
A row holding a pair's token carries that token's quantisation (the bytes moe_dispatch followed
by fp8_group_quant writes there); with zero_padding the padding rows are zero with the scale of
an all-zero group (AMAX_FLOOR / 448), else they are left as they were, q and scales alike.
Rows past offsets[L] are never written.

One form, moe_dispatch's split (its cooperative routing kernel, imported unchanged, then a copy
kernel launched early behind it by programmatic dependent launch), with a copy that quantises:
a token's row is read once and quantised once, however many of its K rows it is stored to, and
the quantisation (loads, amax over a group's lanes by shuffles, scale, e4m3 conversion) runs
before the copy waits for routing, so it overlaps routing's latency. Why only split: it is the
one form whose copy is a kernel of its own, so quantising changes only that kernel. The decode
forms (fused, replicated) route and copy in one kernel, and a quantising one would repeat that
kernel's routing whole; at decode the chain this replaces (moe_dispatch, then fp8_group_quant
of every row of the capacity, T * K + L * (pad - 1): 3848 rows for one token of DeepSeek-V3's
256 experts) quantises hundreds of times the rows split's second, overlapped launch costs, so a
one-kernel decode form is left until the H200's bench says it pays. split_bulk moves rows
through shared memory without registers, where quantising needs them; split_block_ranks pays
only for few local experts, which the FP8 models (DeepSeek-V3: 256) do not have.

Work split (moe_dispatch/fp8_quant_kernels.py): a quantisation group of G elements is
G / VEC 128-bit vectors spread over `lanes_per_group` consecutive lanes of a warp (the amax's
shuffles), the block's THREADS / lanes group slots cover a row's groups in slices, and a work
unit is (tokens_per_block tokens, a slice), as moe_dispatch's copy units are (vectors there).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import (
    MAX_VECTORS_PER_THREAD,
    WARP,
    block_fits_register_file,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES, vector_elements
from cutetune.kernels.fp8_group_quant import (
    kernel_scales,
    quant_problem,
    seed_lanes_per_group,
)
from cutetune.kernels.fp8_quant import (
    FP8_DTYPE,
    QUANT_FLOPS_PER_ELEMENT,
    GroupQuantFields,
    check_exact,
    empty_scales,
    quant_groups_of,
    quantize_reference,
    with_edge_groups,
)
from cutetune.kernels.moe_common import (
    MoEProblem,
    check_dispatch,
    make_routing,
    reference_dispatch,
)
from cutetune.kernels.moe_common import problems_for_model as moe_problems_for_model
from cutetune.kernels.moe_dispatch import new_workspace, split
from cutetune.kernels.moe_dispatch import space as dispatch_space
from cutetune.kernels.moe_dispatch.common import (
    REPLICATED_MAX_PAIRS,
    ROUTING_GRIDS,
    WARPS_PARAM,
    copy_unit_total,
    expected_padding_rows,
    local_pairs,
    tokens_per_block_param,
)
from cutetune.kernels.moe_dispatch.launcher import CompiledDispatch
from cutetune.kernels.registry import (
    ChainStep,
    DeviceCompile,
    KernelDef,
    Tensors,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.space import Constraint, Param, Space

NAME = "moe_dispatch_fp8_quant"
OUTPUTS = ("counts", "offsets", "row_of", "q", "scales", "error")
# The copy's accesses: 128 bits of x (a group of 64 or 128 bf16/fp16 elements is a whole
# number of them), 64 bits of q.
VECTOR_BITS = 128
# The unfused chain's bf16 rows (moe_dispatch's dispatched, fp8_group_quant's x): bench_inputs'
# buffer.
DISPATCHED = "dispatched"


@dataclass(frozen=True, kw_only=True)
class MoEDispatchFP8QuantProblem(MoEProblem, GroupQuantFields):
    """moe_dispatch's problem with the quantisation's fields (fp8_quant.GroupQuantFields)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_quant(self.dtype, self.hidden, "hidden")

    @property
    def dispatch(self) -> MoEProblem:
        """The dispatch this quantises the rows of, as moe_dispatch states it."""
        return MoEProblem(**{f.name: getattr(self, f.name)
                             for f in dataclasses.fields(MoEProblem)})


@dataclass(frozen=True)
class DispatchFP8QuantConfig:
    grid_blocks: int
    warps_per_block: int
    tokens_per_block: int
    lanes_per_group: int
    cache_hints: str = cache_hints.NORMAL

    @property
    def routing(self) -> split.SplitConfig:
        """moe_dispatch's split point whose routing kernel this point launches: its grid,
        block size and token batch, on which moe_dispatch's constraints and its launch path's
        residency check read the routing kernel's resources."""
        return split.SplitConfig(self.grid_blocks, self.warps_per_block, self.tokens_per_block,
                                 self.cache_hints)


def _vector_elements(problem: MoEDispatchFP8QuantProblem) -> int:
    return vector_elements(problem.dtype, VECTOR_BITS)


def _vectors_per_lane(problem: MoEDispatchFP8QuantProblem,
                      config: DispatchFP8QuantConfig) -> int:
    return problem.group_size // (_vector_elements(problem) * config.lanes_per_group)


def _loads_per_thread(problem: MoEDispatchFP8QuantProblem, config: DispatchFP8QuantConfig) -> int:
    return config.tokens_per_block * _vectors_per_lane(problem, config)


def _registers_per_thread(problem: MoEDispatchFP8QuantProblem,
                          config: DispatchFP8QuantConfig) -> int:
    # Every loaded vector in fp32 (held from the loads through the wait for routing, with its
    # e4m3 codes), and each token's K row indices.
    return estimated_registers(_loads_per_thread(problem, config) * _vector_elements(problem)
                               + config.tokens_per_block * problem.top_k)


def _on_routing(constraint: Constraint) -> Constraint:
    """A constraint of moe_dispatch (its shared ones, its split form's) held by the routing
    kernel this point launches: the same name and reason, over the dispatch problem and the
    split point (config.routing)."""
    return Constraint(constraint.name, constraint.reason,
                      lambda p, c, d: constraint.holds(p.dispatch, c.routing, d))


def _slices(problem: MoEDispatchFP8QuantProblem, config: DispatchFP8QuantConfig) -> int:
    """Slices of a row: its groups over the block's group slots."""
    slots = config.warps_per_block * WARP // config.lanes_per_group
    return math.ceil(problem.hidden // problem.group_size / slots)


SPACE = Space(
    config_type=DispatchFP8QuantConfig,
    params=(
        Param("grid_blocks", ROUTING_GRIDS, "blocks of the routing kernel (all route)"),
        WARPS_PARAM,
        tokens_per_block_param(doc="tokens whose groups a thread loads and quantises before "
                                   "storing them (ILP of the copy)"),
        Param("lanes_per_group", (4, 8, 16),
              "consecutive lanes sharing one quantisation group: its amax takes log2 of them "
              "shuffles"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        *(_on_routing(c) for c in (*dispatch_space.SPACE.constraints, *split.FORM.constraints)),
        Constraint(
            "group_splits_among_lanes",
            "a group must be a whole number of 128-bit vectors for each of its lanes "
            "(group_size a multiple of vector elements x lanes_per_group)",
            lambda p, c, d: p.group_size % (_vector_elements(p) * c.lanes_per_group) == 0,
        ),
        Constraint(
            "loads_per_thread_unrollable",
            f"a thread may make at most {MAX_VECTORS_PER_THREAD} vector loads (unrolled)",
            lambda p, c, d: _loads_per_thread(p, c) <= MAX_VECTORS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
    ),
)


def default_config(problem: MoEDispatchFP8QuantProblem, device) -> DispatchFP8QuantConfig:
    """moe_dispatch's split default (the routing grid of about ROUTED_PAIRS_PER_BLOCK pairs a
    block, streaming hints, 8 warps, 4 for at most 256 pairs), one token per thread, and
    fp8_group_quant's seed lanes a group (seed_lanes_per_group: 8 for a group of 128 bf16).
    Where none of these fits the device, narrower grids and blocks, then the space's first
    valid point."""
    lanes = seed_lanes_per_group(problem.group_size, problem.dtype)
    pairs = problem.num_tokens * problem.top_k
    wide_warps = 4 if pairs <= REPLICATED_MAX_PAIRS // 4 else 8
    grids = [blocks for blocks in ROUTING_GRIDS
             if blocks <= dispatch_space.default_routing_grid(pairs)]
    for blocks in reversed(grids):
        for warps in dict.fromkeys((wide_warps, 8, 4, 1)):
            config = DispatchFP8QuantConfig(blocks, warps, 1, lanes, cache_hints.STREAMING)
            if SPACE.first_violation(problem, config, device) is None:
                return config
    # An empty space raises here, saying which constraint removed how many points.
    return SPACE.valid_points(problem, device)[0]


def cost(problem: MoEDispatchFP8QuantProblem, config: DispatchFP8QuantConfig, device) -> Cost:
    """Bytes at DRAM: routing's as moe_dispatch's (topk_ids read and row_of written once,
    counts/offsets/error written once); x read once per token (every token, local or not);
    each local pair's FP8 row (one byte an element) and its scales written once; with
    zero_padding, the expected padding rows (moe_dispatch's estimate) written as zeros and
    their scales. The quantisation's FLOPs once per token element (a token is quantised once,
    whatever its K). The grid barrier and the second launch are split's."""
    groups = problem.hidden // problem.group_size
    out_row = problem.hidden + 4 * groups
    pairs = problem.num_tokens * problem.top_k
    routing = 4 * pairs + 4 * pairs + 4 * (2 * problem.local_experts + 2)
    copy = (problem.num_tokens * problem.hidden * DTYPE_BYTES[problem.dtype]
            + local_pairs(problem) * out_row)
    padding = (math.ceil(expected_padding_rows(problem) * out_row) if problem.zero_padding
               else 0)
    return Cost(
        bytes_moved=routing + copy + padding,
        flops=QUANT_FLOPS_PER_ELEMENT * problem.num_tokens * problem.hidden,
        # The copy's grid (with zero_padding, a block per local expert at least).
        blocks=max(copy_unit_total(problem.num_tokens, config.tokens_per_block,
                                   _slices(problem, config)),
                   problem.local_experts if problem.zero_padding and problem.pad > 1 else 1),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        launches=2,
        grid_barriers=1,
        bytes_in_flight_per_thread=_loads_per_thread(problem, config) * VECTOR_BITS // 8,
    )


class CompiledDispatchFP8Quant(CompiledDispatch):
    """moe_dispatch's launch path (the routing kernel's cooperative grid checked on each
    device before it launches), called with (x, topk_ids, row_of, q, scales, counts, offsets,
    error, workspace)."""

    def __init__(self, problem: MoEDispatchFP8QuantProblem, config: DispatchFP8QuantConfig,
                 fn):
        super().__init__(problem.dispatch, config.routing, fn)

    def __call__(self, x, topk_ids, row_of, q, scales, counts, offsets, error, workspace):
        self.check_device(x.get_device())
        self.fn(x, topk_ids, row_of, q, scales, counts, offsets, error, workspace)


def launch(compiled: CompiledDispatchFP8Quant, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["topk_ids"], tensors["row_of"], tensors["q"],
             tensors["scales"], tensors["counts"], tensors["offsets"], tensors["error"],
             tensors["workspace"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, check, chain, model problems


def reference(tensors: Tensors, problem: MoEDispatchFP8QuantProblem) -> dict[str, torch.Tensor]:
    """moe_dispatch's reference (every row of the capacity: the pairs' tokens, zeros
    elsewhere), then fp8_group_quant's of those rows."""
    dispatched = reference_dispatch(tensors["x"], tensors["topk_ids"], problem.dispatch)
    q, scales = quantize_reference(dispatched.pop("dispatched").float(), problem.group_size,
                                   problem.ue8m0)
    return {**dispatched, "q": q, "scales": kernel_scales(scales, problem.column_major_scales)}


def _codes(q: torch.Tensor) -> torch.Tensor:
    """FP8 rows (or their fp32 values, the reference's) as their e4m3 bytes, compared bit for
    bit (the sign of a zero too)."""
    return (q if q.dtype is FP8_DTYPE else q.to(FP8_DTYPE)).view(torch.uint8)


def check(outputs: Tensors, expected, problem: MoEDispatchFP8QuantProblem) -> None:
    """moe_common's check of the layout over q's bytes (every pair in its expert's segment, in
    a row of its own holding its token's e4m3 codes exactly; padding rows zero with
    zero_padding), then each pair's row's scales exactly as the reference's row of the same
    pair holds them, and with zero_padding the padding rows' (an all-zero group's)."""
    check_dispatch({**outputs, "dispatched": _codes(outputs["q"])},
                   {**expected, "dispatched": _codes(expected["q"])}, problem.dispatch)
    want = expected["row_of"].flatten().long()
    kept = want >= 0
    rows = outputs["row_of"].flatten().long()[kept]
    # (rows, groups) whatever the layout.
    got = kernel_scales(outputs["scales"], problem.column_major_scales)
    wanted = kernel_scales(expected["scales"], problem.column_major_scales)
    check_exact({"scales": got[rows]}, {"scales": wanted[want[kept]]}, ("scales",))
    if problem.zero_padding:
        used = int(expected["offsets"][-1])
        padding = torch.ones(used, dtype=torch.bool, device=rows.device)
        padding[rows] = False
        check_exact({"padding scales": got[:used][padding]},
                    {"padding scales": wanted[:used][padding]}, ("padding scales",))


def make_inputs(problem: MoEDispatchFP8QuantProblem, device,
                generator: torch.Generator) -> Tensors:
    """x about N(0, 1) times a per-token magnitude from 2^-8 to 2^8, with edge-case groups
    (fp8_quant.with_edge_groups: all zeros, below the amax floor, ties, saturation), uniform
    routing; the outputs allocated (the verifier poisons them), the scales in the op's layout
    (TMA-padded when column-major), and a workspace."""
    dtype = TORCH_DTYPES[problem.dtype]
    tokens, L = problem.num_tokens, problem.local_experts
    magnitude = torch.exp2(torch.randint(-8, 9, (tokens, 1), generator=generator,
                                         device=device).float())
    x = magnitude * torch.randn(tokens, problem.hidden, generator=generator, device=device)
    x = with_edge_groups(x, problem.group_size, generator)
    topk_ids, _ = make_routing(problem, device, generator)
    capacity = problem.capacity
    scales = empty_scales(capacity, problem.hidden // problem.group_size,
                          problem.column_major_scales, device)
    return {
        "x": x.to(dtype),
        "topk_ids": topk_ids,
        "counts": torch.empty(L, dtype=torch.int32, device=device),
        "offsets": torch.empty(L + 1, dtype=torch.int32, device=device),
        "row_of": torch.empty(tokens, problem.top_k, dtype=torch.int32, device=device),
        "q": torch.empty(capacity, problem.hidden, dtype=FP8_DTYPE, device=device),
        "scales": kernel_scales(scales, problem.column_major_scales),
        "error": torch.empty(1, dtype=torch.int32, device=device),
        "workspace": new_workspace(problem, device),
    }


def bench_inputs(problem: MoEDispatchFP8QuantProblem, device,
                 generator: torch.Generator) -> Tensors:
    """make_inputs plus the unfused chain's bf16 rows (capacity, hidden), which moe_dispatch
    writes and fp8_group_quant reads."""
    tensors = dict(make_inputs(problem, device, generator))
    tensors[DISPATCHED] = torch.empty(problem.capacity, problem.hidden,
                                      dtype=TORCH_DTYPES[problem.dtype], device=device)
    return tensors


# moe_dispatch writes the tokens' bf16 rows, and fp8_group_quant quantises every row of the
# capacity (the rows a call uses are known only on the device): the chain's counts, offsets,
# row_of and error are moe_dispatch's, its q and scales fp8_group_quant's, the fused kernel's
# on every row this kernel writes.
UNFUSED = (
    ChainStep("moe_dispatch", lambda p: p.dispatch),
    ChainStep("fp8_group_quant", lambda p: quant_problem(p.with_tokens(p.capacity), p.hidden),
              names={"x": DISPATCHED}),
)


def problems_for_model(model: ModelShape, dtype: str) -> list[MoEDispatchFP8QuantProblem]:
    """moe_dispatch's problems of a model with FP8 group-quantised activations (its experts'
    up projections read the dispatched rows quantised): column-major scales, the layout the
    block-scaled grouped GEMMs of Hopper read; powers of two where the model's scale_fmt says
    ue8m0."""
    group, ue8m0 = quant_groups_of(model, NAME)
    return [MoEDispatchFP8QuantProblem(**dispatch.static_fields(), num_tokens=1,
                                       group_size=group, column_major_scales=True, ue8m0=ue8m0)
            for dispatch in moe_problems_for_model(model, dtype) if dispatch.hidden % group == 0]


KERNEL = register(KernelDef(
    name=NAME,
    description="MoE dispatch (TP=1) writing FP8 rows with one fp32 scale per group: each "
                "token quantised once on its way to its experts' padded segments",
    problem_type=MoEDispatchFP8QuantProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.moe_dispatch.fp8_quant_kernels"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=OUTPUTS,
    written_in_place=(),
    tolerance={"float32": (0.0, 0.0)},
    source_file=__file__,
    check=check,
    bind=CompiledDispatchFP8Quant,
    unfused=UNFUSED,
    bench_inputs=bench_inputs,
))
