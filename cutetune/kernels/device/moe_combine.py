"""MoE combine's kernel, launcher and compile, as cutetune.kernels.moe_combine declares them."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.dtypes import DTYPE_BYTES
from cutetune.kernels.moe_combine import CombineConfig, _pairs_per_batch, _vector_elements
from cutetune.kernels.moe_common import MoEProblem


@cute.kernel
def _combine_kernel(mE: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                    VEC: cutlass.Constexpr[int], TOP_K: cutlass.Constexpr[int],
                    BATCH: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int],
                    TOKENS_PER_BLOCK: cutlass.Constexpr[int],
                    HIDDEN_SPLIT: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = cute.size(mO, mode=[0])
    capacity = cute.size(mE, mode=[0])
    first_token = (bidx // HIDDEN_SPLIT) * TOKENS_PER_BLOCK
    part = bidx % HIDDEN_SPLIT

    # The block's pairs, staged once: thread p reads pair p of its tokens (consecutive in
    # row_of and in the weights, so the reads coalesce). A row outside [0, capacity) becomes
    # -1 with weight 0: it is never loaded and adds nothing, whatever its weight held.
    PAIRS = TOKENS_PER_BLOCK * TOP_K
    smem = cutlass.memory.SmemAllocator()
    sRow = smem.allocate_tensor(Int32, cute.make_layout(PAIRS), byte_alignment=16)
    sWeight = smem.allocate_tensor(Float32, cute.make_layout(PAIRS), byte_alignment=16)
    for i in cutlass.range_constexpr((PAIRS + THREADS - 1) // THREADS):
        p = i * THREADS + tidx
        # Past the block's pairs (only in its last round) or past the last token: nothing.
        in_block = p < PAIRS if cutlass.const_expr((i + 1) * THREADS > PAIRS) else True
        if in_block & (first_token + p // TOP_K < tokens):
            row = mR[first_token + p // TOP_K, p % TOP_K]
            weight = mW[first_token + p // TOP_K, p % TOP_K]
            if (row < 0) | (row >= capacity):
                row = Int32(-1)
                weight = Float32(0.0)
            sRow[p] = row
            sWeight[p] = weight
    cute.arch.sync_threads()

    THREADS_PER_TOKEN = THREADS // TOKENS_PER_BLOCK
    row_vectors = cute.size(mO, mode=[1]) // VEC
    SLICE = row_vectors // HIDDEN_SPLIT
    PASSES = (SLICE + THREADS_PER_TOKEN - 1) // THREADS_PER_TOKEN
    ragged = SLICE % THREADS_PER_TOKEN != 0
    slot = tidx // THREADS_PER_TOKEN
    lane = tidx % THREADS_PER_TOKEN
    token = first_token + slot
    if token < tokens:
        rows, weights = [], []
        for k in cutlass.range_constexpr(TOP_K):
            rows.append(sRow[slot * TOP_K + k])
            weights.append(sWeight[slot * TOP_K + k])
        tOgO = cute.zipped_divide(mO[token, None], (VEC,))
        for n in cutlass.range(PASSES):
            at = n * THREADS_PER_TOKEN + lane
            # Only a ragged slice has threads without a vector in the last pass.
            has_vector = at < SLICE if cutlass.const_expr(ragged) else True
            if has_vector:
                col = part * SLICE + at
                acc = cute.full((VEC,), 0.0, Float32)
                for first in cutlass.range_constexpr(0, TOP_K, BATCH):
                    last = min(first + BATCH, TOP_K)
                    # Every load of the batch before the first multiply-add: one memory round
                    # trip per batch, not per pair. A skipped pair loads nothing; its register
                    # vector stays zero (and its weight is zero).
                    loaded = []
                    for k in cutlass.range_constexpr(first, last):
                        tErE = cute.make_rmem_tensor((VEC,), mE.element_type)
                        tErE.fill(0.0)
                        if rows[k] >= 0:
                            tEgE = cute.zipped_divide(mE[rows[k], None], (VEC,))
                            tErE.store(tEgE[(None, col)].load())
                        loaded.append(tErE)
                    for k in cutlass.range_constexpr(first, last):
                        acc = acc + weights[k] * loaded[k - first].load().to(Float32)
                tOgO[(None, col)].store(acc.to(mO.element_type))


@cute.jit
def _combine_launch(mE: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                    stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                    BATCH: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                    TOKENS_PER_BLOCK: cutlass.Constexpr[int],
                    HIDDEN_SPLIT: cutlass.Constexpr[int]):
    tokens = cute.size(mO, mode=[0])
    blocks = (tokens + TOKENS_PER_BLOCK - 1) // TOKENS_PER_BLOCK * HIDDEN_SPLIT
    _combine_kernel(mE, mR, mW, mO, VEC, cute.size(mR, mode=[1]), BATCH, WARPS * WARP,
                    TOKENS_PER_BLOCK, HIDDEN_SPLIT).launch(
        grid=(blocks, 1, 1), block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: MoEProblem, config: CombineConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the capacity and the row strides of expert_out and out are symbolic, so the
    result serves every call of the static problem."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    tokens, capacity = cute.sym_int(), cute.sym_int()

    def rows(count):
        # The start aligned to one vector.
        return fake_rows(dtype, count, (problem.hidden,), vec,
                         assumed_align=vec * DTYPE_BYTES[problem.dtype])

    def pairs(element_type):
        return fake_compact(element_type, (tokens, problem.top_k), assumed_align=4)

    return compile_launcher(
        _combine_launch,
        (rows(capacity), pairs(Int32), pairs(Float32), rows(tokens)),
        (vec, _pairs_per_batch(problem, config), config.warps_per_block,
         config.tokens_per_block, config.hidden_split),
        options)
