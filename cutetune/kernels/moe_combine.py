"""MoE combine: each token's expert outputs, weighted by its routing weights, summed.

    out[t] = sum_k topk_weights[t, k] * expert_out[row_of[t, k]]      (rows of -1 add nothing)

expert_out is (capacity, H) in moe_common's layout (the grouped GEMM's output for the rows
moe_dispatch filled), row_of (T, K) int32 the row each (token, k) pair was copied to, and
topk_weights (T, K) fp32. The sum is accumulated in fp32 registers and stored once, in the
input dtype. A row outside [0, capacity) other than -1 is skipped like -1 and never read:
combine raises no error flag of its own (dispatch does), but it must not fault.

Work split: a block takes TOKENS_PER_BLOCK consecutive tokens and one of HIDDEN_SPLIT equal
slices of their hidden dim (block b: token block b // HIDDEN_SPLIT, slice b % HIDDEN_SPLIT), so
few tokens still fill the GPU (decode: split) and many tokens amortise a block over several
(prefill: tokens per block). The block's first threads stage its tokens' row_of and weights in
shared memory, one coalesced read per token per block, with bad rows already mapped to -1 and
weight 0; after one barrier, each token's THREADS / TOKENS_PER_BLOCK threads own the slice's
vectors lane, lane + threads, ... (coalesced) and, per vector, issue the loads of every pair
(up to 8 pairs of 128 bits at a time) before the first multiply-add: one memory round trip,
not one per pair. A skipped pair's load is predicated off. Token count and capacity are
dynamic, so one compile serves every call; H, K, dtype and the config are compile-time
constants. Row offsets are 64-bit (capacity * H may pass 2^31).

What ptxas makes of it (sm_90a SASS, top-k 8): in one-warp blocks every predicated 128-bit
load is issued ahead of the first FFMA (about 60 registers); in 4- and 8-warp blocks ptxas
issues about half of them ahead and the rest as the first products retire, and the many
resident threads of those blocks keep the bytes in flight instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels import moe_common
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
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    Peer,
    PeerUnavailable,
    Tensors,
    register,
)
from cutetune.spaces.space import Constraint, Param, Space

# The pairs of a token are unrolled at compile time (their loads, their multiply-adds): real
# routers pick 1 to 10 experts per token.
MAX_TOP_K = 32
# Bytes of expert rows a thread loads before its first multiply-add: 8 pairs of 128-bit
# vectors (32 registers). A larger top-k loads its pairs in batches of this size.
MAX_BYTES_IN_FLIGHT = 128
# row_of (int32) and a weight (fp32) per pair, staged in shared memory.
SMEM_BYTES_PER_PAIR = 8


@dataclass(frozen=True)
class CombineConfig:
    hidden_split: int
    tokens_per_block: int
    warps_per_block: int


def vector_bits(problem: MoEProblem) -> int:
    """Bits per thread per global access: the widest vector (of 128, 64, 32 bits) that divides
    the hidden size, as a narrower one moves the same bytes in more, smaller accesses; 0 where
    none does. Derived from the problem, not a knob."""
    return widest_vector_bits(problem.dtype, problem.hidden)


def _vector_elements(problem: MoEProblem, config: CombineConfig) -> int:
    return vector_elements(problem.dtype, vector_bits(problem))


def _slice_vectors(problem: MoEProblem, config: CombineConfig) -> int:
    """Vectors in one block's slice of a token's row."""
    return problem.hidden // _vector_elements(problem, config) // config.hidden_split


def _threads_per_token(config: CombineConfig) -> int:
    return config.warps_per_block * WARP // config.tokens_per_block


def _pairs_per_batch(problem: MoEProblem, config: CombineConfig) -> int:
    """Pairs whose vectors a thread loads before it multiplies and adds them."""
    vector_bytes = vector_bits(problem) // 8
    return min(problem.top_k, MAX_BYTES_IN_FLIGHT // vector_bytes)


def _registers_per_thread(problem: MoEProblem, config: CombineConfig) -> int:
    # A batch of loaded vectors (packed), the fp32 accumulator, each pair's row and weight.
    vec = _vector_elements(problem, config)
    loaded = _pairs_per_batch(problem, config) * vector_bits(problem) // 32
    return estimated_registers(loaded + vec + 2 * problem.top_k)


SPACE = Space(
    config_type=CombineConfig,
    params=(
        # Decode: 1 token of H = 4096 in bf16 is 512 vectors; 16 slices of 32 give 16 one-warp
        # blocks instead of one. 7, 14 and 28 serve hidden sizes with a factor 7 (DeepSeek-V3's
        # 7168 = 7 x 1024, Qwen2-57B's 3584): slices of whole passes of a warp or of 4 warps,
        # where powers of two leave every slice a ragged last pass (7168 / 16: 56 vectors).
        Param("hidden_split", (1, 2, 4, 7, 8, 14, 16, 28),
              "blocks sharing one token's hidden dim"),
        Param("tokens_per_block", (1, 2, 4), "tokens sharing one block (prefill)"),
        # As the other row kernels: 1 warp is the decode block; 8 warps fill an SM with 8
        # blocks, so 16 and 32 would only coarsen the tail (and the compile sweep).
        Param("warps_per_block", (1, 4, 8), "warps in one thread block"),
    ),
    constraints=(
        Constraint(
            "hidden_splits_into_vectors",
            "the hidden size must be a whole number of 32-bit vectors (the accesses are the "
            "widest of 128, 64 and 32 bits that divides it)",
            lambda p, c, d: vector_bits(p) > 0,
        ),
        Constraint(
            "split_into_whole_vectors",
            "hidden_split must divide the row into slices of whole vectors",
            lambda p, c, d: (p.hidden // _vector_elements(p, c)) % c.hidden_split == 0,
        ),
        Constraint(
            "one_grid_policy",
            "hidden_split (few tokens) and tokens_per_block (many tokens) exclude each other: "
            "a block holds either part of one token or several whole ones",
            lambda p, c, d: c.hidden_split == 1 or c.tokens_per_block == 1,
        ),
        Constraint(
            "whole_warps_per_token",
            "tokens_per_block may not exceed warps_per_block: a token's threads are whole "
            "warps, so each warp-wide access covers 32 consecutive vectors of one row; and "
            "several tokens per block is the prefill grid, where one-warp blocks fall short "
            "of the copy ceiling",
            lambda p, c, d: c.tokens_per_block <= c.warps_per_block,
        ),
        Constraint(
            "no_idle_threads",
            "every thread of a token must own at least one vector of the block's slice "
            "(warps_per_block * 32 / tokens_per_block <= vectors per slice)",
            lambda p, c, d: _threads_per_token(c) <= _slice_vectors(p, c),
        ),
        Constraint(
            "top_k_unrollable",
            f"a token's pairs are unrolled at compile time: top_k may be at most {MAX_TOP_K}",
            lambda p, c, d: p.top_k <= MAX_TOP_K,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def _blocks(problem: MoEProblem, config: CombineConfig) -> int:
    return math.ceil(problem.num_tokens / config.tokens_per_block) * config.hidden_split


def default_config(problem: MoEProblem, device) -> CombineConfig:
    """The seed heuristic: 128-bit accesses (or the widest vector that divides H), then the
    grid that puts a block on the most SMs: a token's row split over one-warp blocks while
    the warps the problem needs fit one per SM (decode), else whole tokens in blocks of 8 (or
    4) warps (blocks of 4-8 warps reach the copy ceiling, blocks of 1 warp do not). Among
    grids that cover the SMs alike: fewer warps in decode, more otherwise; then fewer splits
    and fewer tokens per block. Raises EmptySpaceError naming the constraints when no point
    is valid."""
    enumeration = SPACE.enumerate(problem, device)
    enumeration.raise_if_empty(problem.describe())
    vector = vector_elements(problem.dtype, vector_bits(problem))
    vectors = problem.num_tokens * problem.hidden // vector
    decode = math.ceil(vectors / WARP) <= device.sm_count

    def preference(c: CombineConfig) -> tuple:
        covered = min(_blocks(problem, c), device.sm_count)
        warps = -c.warps_per_block if decode else c.warps_per_block
        return (covered, warps, -c.hidden_split, -c.tokens_per_block)

    return max(enumeration.valid, key=preference)


def cost(problem: MoEProblem, config: CombineConfig, device) -> Cost:
    pairs = problem.num_tokens * problem.top_k
    element_bytes = DTYPE_BYTES[problem.dtype]
    return Cost(
        # Every pair's expert row (T * K rows of H), row_of and the weights read once; out
        # written once.
        bytes_moved=(pairs * problem.hidden * element_bytes + pairs * (4 + 4)
                     + problem.num_tokens * problem.hidden * element_bytes),
        # A multiply and an add per accumulated element.
        flops=2 * pairs * problem.hidden,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        smem_per_block=config.tokens_per_block * problem.top_k * SMEM_BYTES_PER_PAIR,
        bytes_in_flight_per_thread=_pairs_per_batch(problem, config) * vector_bits(problem) // 8,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/moe_combine.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"], tensors["out"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, peers


def reference(tensors: Tensors, problem: MoEProblem) -> dict[str, torch.Tensor]:
    """fp32 weighted sum of each token's expert rows (moe_common's reference)."""
    return {"out": moe_common.reference_combine(tensors["expert_out"], tensors["row_of"],
                                                tensors["topk_weights"])}


def make_inputs(problem: MoEProblem, device, generator: torch.Generator) -> Tensors:
    """Uniform routing laid out as moe_dispatch lays it (moe_common's reference layout: pairs
    of experts outside the local range get -1); random expert outputs in every row of the
    capacity (padding and unused rows too, which combine must not read); out allocated (the
    verifier poisons it)."""
    topk_ids, topk_weights = moe_common.make_routing(problem, device, generator)
    row_of = moe_common.reference_layout(topk_ids, problem)["row_of"]
    dtype = TORCH_DTYPES[problem.dtype]
    expert_out = torch.randn(problem.capacity, problem.hidden, generator=generator,
                             device=device, dtype=torch.float32).to(dtype)
    return {"expert_out": expert_out, "row_of": row_of, "topk_weights": topk_weights,
            "out": torch.empty(problem.num_tokens, problem.hidden, dtype=dtype, device=device)}


def _liger_token_aggregation(problem: MoEProblem):
    """liger's fused-MoE token aggregation (a Triton kernel, one program per token): the same
    weighted gather-sum with fp32 accumulation, but it reads a row for every pair."""
    if problem.expert_begin != 0 or problem.expert_end != problem.experts:
        raise PeerUnavailable("liger's token aggregation reads a row for every pair: it cannot "
                              "skip the pairs of experts outside a local range (row -1)")
    try:
        from liger_kernel.ops.fused_moe import _token_aggregation
    except ImportError as err:
        raise PeerUnavailable(f"liger-kernel with fused_moe is not installed ({err})") from None
    top_k, hidden = problem.top_k, problem.hidden

    def run(t: Tensors) -> dict[str, torch.Tensor]:
        row_of = t["row_of"]
        return {"out": _token_aggregation(t["expert_out"], t["topk_weights"].view(-1),
                                          row_of.view(-1), row_of.shape[0], top_k, hidden)}
    return run


KERNEL = register(KernelDef(
    name="moe_combine",
    description="MoE combine: each token's expert rows weighted by its routing weights and "
                "summed in fp32",
    problem_type=MoEProblem,
    space=SPACE,
    problems_for_model=moe_common.problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.moe_combine"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("out",),
    written_in_place=(),
    # The K products are summed in fp32 and rounded once, to the output dtype: the error is
    # half an output ulp plus fp32 rounding (about K * 2^-24 of the terms' magnitudes), inside
    # a few ulps of bf16 and fp16 whatever K.
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    peers=(Peer("liger token aggregation (triton)", _liger_token_aggregation),),
))
