"""QK-norm's kernel, launcher and compile, as cutetune.kernels.qk_norm declares them."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import blocks as device_blocks
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.qk_norm import (
    QKNormConfig,
    QKNormProblem,
    _threads_per_head,
    _vector_elements,
)


@cute.jit
def _normalise_head(mX: cute.Tensor, mW: cute.Tensor, row: Int32, lane: Int32,
                    VEC: cutlass.Constexpr[int], THREADS_PER_HEAD: cutlass.Constexpr[int],
                    EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float]):
    """Normalise head `row` (token-major over mX's (tokens, heads)) by its THREADS_PER_HEAD
    threads. Threads past the last head load a valid head, so that every lane joins the
    shuffles, and store nothing."""
    heads = cute.size(mX, mode=[1])
    head_dim = cute.size(mX, mode=[2])
    rows = cute.size(mX, mode=[0]) * heads
    safe_row = cutlass.min(row, rows - 1)
    tXgX = cute.zipped_divide(mX[safe_row // heads, safe_row % heads, None], (VEC,))
    tWgW = cute.zipped_divide(mW, (VEC,))
    vectors_per_thread = head_dim // (VEC * THREADS_PER_HEAD)
    tWrW = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        tWrW.append(device_blocks.preload_fp32(tWgW, v * THREADS_PER_HEAD + lane))
    square_sum = device_blocks.tied_zero(tWrW)
    tXrX = []
    for v in cutlass.range_constexpr(vectors_per_thread):
        x = tXgX[(None, v * THREADS_PER_HEAD + lane)].load().to(Float32)
        tXrX.append(x)
        square_sum = square_sum + device_blocks.sum_of_squares(x)
    square_sum = device_blocks.butterfly_sum(square_sum, THREADS_PER_HEAD)
    inv_rms = device_blocks.inverse_rms(square_sum, head_dim, EPS)
    if row < rows:
        for v in cutlass.range_constexpr(vectors_per_thread):
            y = device_blocks.rms_normalised(tXrX[v], inv_rms, tWrW[v], WEIGHT_BIAS)
            tXgX[(None, v * THREADS_PER_HEAD + lane)].store(y.to(mX.element_type))


@cute.kernel
def _qk_norm_kernel(mQ: cute.Tensor, mK: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor,
                    q_blocks: Int32, VEC: cutlass.Constexpr[int],
                    THREADS_PER_HEAD: cutlass.Constexpr[int],
                    HEADS_PER_BLOCK: cutlass.Constexpr[int], EPS: cutlass.Constexpr[float],
                    WEIGHT_BIAS: cutlass.Constexpr[float]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % THREADS_PER_HEAD
    slot = tidx // THREADS_PER_HEAD
    if bidx < q_blocks:
        _normalise_head(mQ, mQW, bidx * HEADS_PER_BLOCK + slot, lane, VEC, THREADS_PER_HEAD,
                        EPS, WEIGHT_BIAS)
    else:
        _normalise_head(mK, mKW, (bidx - q_blocks) * HEADS_PER_BLOCK + slot, lane, VEC,
                        THREADS_PER_HEAD, EPS, WEIGHT_BIAS)


@cute.jit
def _qk_norm_launch(mQ: cute.Tensor, mK: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor,
                    stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                    THREADS_PER_HEAD: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                    EPS: cutlass.Constexpr[float], WEIGHT_BIAS: cutlass.Constexpr[float]):
    heads_per_block = WARPS * WARP // THREADS_PER_HEAD
    tokens = cute.size(mQ, mode=[0])
    q_blocks = (tokens * cute.size(mQ, mode=[1]) + heads_per_block - 1) // heads_per_block
    k_blocks = (tokens * cute.size(mK, mode=[1]) + heads_per_block - 1) // heads_per_block
    _qk_norm_kernel(mQ, mK, mQW, mKW, q_blocks, VEC, THREADS_PER_HEAD, heads_per_block, EPS,
                    WEIGHT_BIAS).launch(grid=(q_blocks + k_blocks, 1, 1),
                                        block=(WARPS * WARP, 1, 1), stream=stream)


def compile_kernel(problem: QKNormProblem, config: QKNormConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count and token strides are symbolic, so the result serves every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    tokens = cute.sym_int()

    def heads_tensor(heads: int):
        return fake_rows(dtype, tokens, (heads, problem.head_dim), vec, assumed_align=16)

    def weight_tensor():
        return fake_compact(dtype, (problem.head_dim,), assumed_align=16)

    return compile_launcher(
        _qk_norm_launch,
        (heads_tensor(problem.q_heads), heads_tensor(problem.kv_heads), weight_tensor(),
         weight_tensor()),
        (vec, _threads_per_head(config), config.warps_per_block, float(problem.eps),
         float(problem.weight_bias)),
        options)
