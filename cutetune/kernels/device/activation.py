"""The gated activations' kernel, launcher and compile, as cutetune.kernels.activation declares
them."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from cutetune.kernels.activation import (
    GELU_TANH,
    GELU_TANH_K1,
    GELU_TANH_K3,
    INV_SQRT_2,
    LOG2_E,
    SILU,
    ActivationConfig,
    GatedProblem,
    _vector_elements,
)
from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.compiling import compile_launcher, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES


def _sigmoid(z):
    """1 / (1 + e^-z) with ex2.approx (2 ulp) and rcp.approx (1 ulp): within about 3e-7 plus
    1e-7 |z| relative, so about 1e-6 where sigmoid is not yet saturated (and 0 or 1 beyond),
    inside even fp32's tolerance of 1e-5; no division, no range reduction."""
    return cute.math.rcp(1.0 + cute.math.exp2(z * -LOG2_E, fastmath=True), approx=True,
                         ftz=True)


def _activation(g, ACTIVATION: str):
    """act(g) of an fp32 vector, for the compile-time activation name."""
    if cutlass.const_expr(ACTIVATION == SILU):
        return g * _sigmoid(g)
    if cutlass.const_expr(ACTIVATION == GELU_TANH):
        # 0.5 (1 + tanh z) = sigmoid(2z): no cancellation where tanh z nears -1 (tanh.approx
        # would err by ~5e-4 there, beyond fp16's tolerance once multiplied by up).
        return g * _sigmoid(g * (GELU_TANH_K1 + GELU_TANH_K3 * (g * g)))
    # The erf form: without fastmath the DSL inlines libdevice's erff (2 ulp); where 1 + erf
    # cancels, gelu itself is below 1e-7 |x|, well inside every tolerance.
    return 0.5 * g * (1.0 + cute.math.erf(g * INV_SQRT_2))


@cute.kernel
def _act_and_mul_kernel(mX: cute.Tensor, mO: cute.Tensor, VEC: cutlass.Constexpr[int],
                        VECTORS_PER_THREAD: cutlass.Constexpr[int],
                        THREADS: cutlass.Constexpr[int], ACTIVATION: cutlass.Constexpr[str],
                        HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = cute.size(mO, mode=[0])
    vectors_per_row = cute.size(mO, mode=[1]) // VEC
    # The block's first vector as (row, column), split in 64 bits because tokens * I / VEC
    # may pass 2^31; each thread's vectors then lie less than one block past it, in 32 bits.
    first = Int64(bidx) * (THREADS * VECTORS_PER_THREAD)
    row0 = Int32(first // vectors_per_row)
    col0 = Int32(first - Int64(row0) * vectors_per_row)
    # Every load first, then the math and the stores, so a thread waits for one memory round
    # trip. A vector past the last row loads the last row instead and stores nothing.
    rows, cols, gates, ups = [], [], [], []
    for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
        at = col0 + (v * THREADS + tidx)
        row = row0 + at // vectors_per_row
        col = at % vectors_per_row
        tXgX = cute.zipped_divide(mX[cutlass.min(row, tokens - 1), None], (VEC,))
        gates.append(cache_hints.load(tXgX[(None, col)], HINTS))
        ups.append(cache_hints.load(tXgX[(None, col + vectors_per_row)], HINTS))
        rows.append(row)
        cols.append(col)
    for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
        y = _activation(gates[v].to(Float32), ACTIVATION) * ups[v].to(Float32)
        if rows[v] < tokens:
            tOgO = cute.zipped_divide(mO[rows[v], None], (VEC,))
            cache_hints.store(tOgO[(None, cols[v])], y.to(mO.element_type), HINTS)


@cute.jit
def _act_and_mul_launch(mX: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream,
                        VEC: cutlass.Constexpr[int], VECTORS_PER_THREAD: cutlass.Constexpr[int],
                        WARPS: cutlass.Constexpr[int], ACTIVATION: cutlass.Constexpr[str],
                        HINTS: cutlass.Constexpr[str]):
    threads = WARPS * WARP
    per_block = threads * VECTORS_PER_THREAD
    vectors = Int64(cute.size(mO, mode=[0])) * (cute.size(mO, mode=[1]) // VEC)
    blocks = Int32((vectors + per_block - 1) // per_block)
    _act_and_mul_kernel(mX, mO, VEC, VECTORS_PER_THREAD, threads, ACTIVATION, HINTS).launch(
        grid=(blocks, 1, 1), block=(threads, 1, 1), stream=stream)


def compile_kernel(problem: GatedProblem, config: ActivationConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count and both row strides are symbolic, so the result serves every call."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    tokens = cute.sym_int()

    def rows(width: int):
        return fake_rows(dtype, tokens, (width,), vec, assumed_align=16)

    return compile_launcher(
        _act_and_mul_launch,
        (rows(2 * problem.intermediate), rows(problem.intermediate)),
        (vec, config.vectors_per_thread, config.warps_per_block, problem.activation,
         config.cache_hints),
        options)
