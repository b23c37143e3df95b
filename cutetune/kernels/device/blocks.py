"""Device-side building blocks the kernels share: weight preloads, the tie that keeps them ahead
of a reduction, sums over lanes by butterfly shuffles and across a block's warps through shared
memory, and the RMS scale of the norms. Cache-hinted global accesses live in cache_hints.

The plain functions run while a kernel is traced, so their code lands inline in the kernel that
calls them; the one with a run-time branch is a @cute.jit function, inlined the same way.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


def preload_fp32(tXgX: cute.Tensor, slot):
    """Vector `slot` of tXgX (a tensor divided into vectors, as cute.zipped_divide makes it),
    loaded and converted to fp32. The norms load their weights so, with x and before the
    reduction, so that a decode-sized call waits for one memory round trip instead of two
    (tied_zero keeps ptxas from moving those loads after the reduction)."""
    return tXgX[(None, slot)].load().to(Float32)


def tied_zero(preloaded: list) -> Float32:
    """A zero that depends on every vector of `preloaded` (preload_fp32's vectors): start a
    reduction's sum from it.

    ptxas sinks a load whose value is needed only after the reduction (the weight) down to its
    use, so a call would wait for two memory round trips: without the tie, the SASS of rmsnorm
    (block_per_row, 128-bit, 8 warps, hidden 4096) loads the weight after the warp's shuffles,
    and qk_norm's loads it in the store branch (tests/kernels/test_load_order_sass.py checks the
    order). Adding 0 * w to the sum ties each weight load before the reduction; IEEE keeps
    0 * w (it is NaN for an infinite w), so no compiler stage folds it away."""
    zero = Float32(0.0)
    for vector in preloaded:
        zero = zero + vector[0] * 0.0
    return zero


def sum_of_squares(x) -> Float32:
    """The sum of the squares of an fp32 register vector."""
    return (x * x).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)


def butterfly_sum(value: Float32, lanes: int) -> Float32:
    """`value` summed over each aligned group of `lanes` lanes of a warp (a power of two, at
    most 32) by log2(lanes) butterfly shuffles: every lane of a group ends with its group's
    sum."""
    for i in range(int(math.log2(lanes))):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=lanes >> (i + 1))
    return value


@cute.jit
def sum_across_warps(warp_sum: Float32, warp: Int32, warp_lane: Int32,
                     WARPS: cutlass.Constexpr[int]) -> Float32:
    """The block's total of its WARPS warps' sums (each warp's lanes all holding its sum, as
    butterfly_sum leaves them), in every lane; one block barrier, so every thread of the block
    must call this. Each warp's sum goes to its slot of a WARPS-float shared buffer (distinct
    banks); after the barrier, lane l reads slot l % WARPS (a broadcast where WARPS < 32), so
    every group of WARPS lanes holds all the partial sums and log2(WARPS) butterfly rounds give
    each lane the total."""
    smem = cutlass.memory.SmemAllocator()
    sPartial = smem.allocate_tensor(Float32, cute.make_layout(WARPS), byte_alignment=16)
    if warp_lane == 0:
        sPartial[warp] = warp_sum
    cute.arch.sync_threads()
    return butterfly_sum(sPartial[warp_lane % WARPS], WARPS)


def inverse_rms(squares: Float32, count: int, eps: float) -> Float32:
    """rsqrt(mean square + eps) of `count` elements whose squares sum to `squares`, without
    fast-math approximations."""
    return cute.math.rsqrt(squares * (1.0 / count) + eps, fastmath=False)


def rms_normalised(x, inv_rms: Float32, w, weight_bias: float):
    """(w + weight_bias) * (x * inv_rms) of fp32 vectors x and w; a weight_bias of 0 adds
    nothing to the code."""
    if weight_bias != 0.0:
        w = w + weight_bias
    return w * (x * inv_rms)
