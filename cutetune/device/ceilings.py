"""Ceilings measured on the device: copy bandwidth, the launch floor and the cost of a grid
barrier.

The copy ceiling comes from a CuTeDSL copy kernel timed with events: inside a CUDA graph,
torch's copy_ becomes a memcpy node that runs well below what a kernel reaches, which would
inflate every percent-of-ceiling figure."""

from __future__ import annotations

import functools

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from cutetune.device.measure import Measurement, input_sets_for, time_events, time_in_graph
from cutetune.kernels.moe_dispatch.common import WS_BARRIER
from cutetune.kernels.moe_dispatch.device import grid_barrier
from cutetune.kernels.moe_dispatch.launcher import check_cooperative_grid

COPY_BYTES = 2 * 2**30
COPY_THREADS = 256
COPY_VECTORS_PER_THREAD = 4


@cute.kernel
def _copy_kernel(gSrc: cute.Tensor, gDst: cute.Tensor, VECTORS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    first = bidx * bdim * VECTORS + tidx
    values = []
    for v in cutlass.range_constexpr(VECTORS):
        values.append(gSrc[(None, first + v * bdim)].load())
    for v in cutlass.range_constexpr(VECTORS):
        gDst[(None, first + v * bdim)].store(values[v])


@cute.jit
def _copy(mSrc: cute.Tensor, mDst: cute.Tensor, stream: cuda.CUstream,
          VECTORS: cutlass.Constexpr[int]):
    gSrc = cute.zipped_divide(mSrc, (4,))
    gDst = cute.zipped_divide(mDst, (4,))
    blocks = cute.size(gSrc, mode=[1]) // (COPY_THREADS * VECTORS)
    _copy_kernel(gSrc, gDst, VECTORS).launch(grid=(blocks, 1, 1), block=(COPY_THREADS, 1, 1),
                                             stream=stream)


@cute.kernel
def _empty_kernel(gX: cute.Tensor):
    pass


@cute.jit
def _empty(mX: cute.Tensor, stream: cuda.CUstream):
    _empty_kernel(mX).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def _compile(fn, *fakes, constants=()):
    return cute.compile(fn, *fakes, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                        *constants, options="--enable-tvm-ffi")


# The copy kernel moves whole blocks: its word count must be a multiple of this.
COPY_GRANULE_WORDS = 4 * COPY_THREADS * COPY_VECTORS_PER_THREAD


@functools.cache
def _copy_kernel_compiled():
    n = cute.sym_int(divisibility=COPY_GRANULE_WORDS)
    fake = cute.runtime.make_fake_compact_tensor(cutlass.Int32, (n,), assumed_align=16)
    return _compile(_copy, fake, fake, constants=(COPY_VECTORS_PER_THREAD,))


def time_copy_of(bytes_moved: int, l2_bytes: int) -> Measurement:
    """A copy moving `bytes_moved` (half read, half written), timed the way kernels are (graph
    replay over rotated buffers): the ceiling at that size, where launch latency and the ramp
    at the start and end of a kernel weigh, as they do not in the 4 GB copy."""
    granule = 4 * COPY_GRANULE_WORDS
    half = max(granule, round(bytes_moved / 2 / granule) * granule)
    copy = _copy_kernel_compiled()
    buffers = [(torch.empty(half // 4, dtype=torch.int32, device="cuda"),
                torch.empty(half // 4, dtype=torch.int32, device="cuda"))
               for _ in range(input_sets_for(2 * half, l2_bytes))]
    return time_in_graph([lambda s=s, d=d: copy(s, d) for s, d in buffers])


def measure_copy_gbps() -> float:
    """Bytes read plus bytes written per second by the faster of a 128-bit-per-access CuTeDSL
    copy kernel and torch's copy_, each timed with events (median of 15)."""
    words = COPY_BYTES // 4
    src = torch.randint(0, 2**31 - 1, (words,), dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    copy = _copy_kernel_compiled()
    copy(src, dst)
    torch.cuda.synchronize()
    if not torch.equal(src, dst):
        raise RuntimeError("the copy-ceiling kernel did not copy correctly")
    kernel_times = sorted(time_events(lambda: copy(src, dst), repeats=15))
    # torch's copy_ outside a graph runs as a copy kernel too; the ceiling is the better of
    # the two, so that no kernel of ours is credited above what a plain copy reaches.
    torch_times = sorted(time_events(lambda: dst.copy_(src), repeats=15))
    best_us = min(kernel_times[len(kernel_times) // 2], torch_times[len(torch_times) // 2])
    return 2 * COPY_BYTES / (best_us * 1e-6) / 1e9


def measure_launch_floor_us() -> float:
    """Time per launch of an empty kernel replayed in a CUDA graph."""
    x = torch.zeros(16, device="cuda")
    fake = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (16,), assumed_align=16)
    empty = _compile(_empty, fake)
    return time_in_graph([lambda: empty(x)]).median_us


# Grid barriers per launch the barrier's cost is fitted over, and the threads of each block.
BARRIER_ROUNDS = (0, 1, 2, 4)
BARRIER_THREADS = 128


@cute.kernel
def _barriers_kernel(mWs: cute.Tensor, ROUNDS: cutlass.Constexpr[int],
                     BLOCKS: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    for _ in cutlass.range_constexpr(ROUNDS):
        grid_barrier(mWs, tidx, bidx, BLOCKS)


@cute.jit
def _barriers(mWs: cute.Tensor, stream: cuda.CUstream, ROUNDS: cutlass.Constexpr[int],
              BLOCKS: cutlass.Constexpr[int], THREADS: cutlass.Constexpr[int]):
    _barriers_kernel(mWs, ROUNDS, BLOCKS).launch(grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1),
                                                 stream=stream, cooperative=True)


def slope_and_intercept(xs, ys) -> tuple[float, float]:
    """The least-squares line through (xs, ys)."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    return slope, mean_y - slope * mean_x


def time_grid_barriers(blocks: int, threads: int = BARRIER_THREADS
                       ) -> list[Measurement]:
    """A cooperative kernel of `blocks` blocks passing each count of BARRIER_ROUNDS grid
    barriers (moe_dispatch's), timed in a CUDA graph; RuntimeError where the barrier word is
    not back at its starting low bits after the replays (the barrier must re-arm itself)."""
    check_cooperative_grid(blocks, threads, 32, 0,
                           torch.cuda.get_device_properties(torch.cuda.current_device()))
    workspace = torch.zeros(64, dtype=torch.int32, device="cuda")
    fake = cute.runtime.make_fake_compact_tensor(cutlass.Int32, (64,), assumed_align=4)
    measured = []
    for rounds in BARRIER_ROUNDS:
        compiled = _compile(_barriers, fake, constants=(rounds, blocks, threads))
        measured.append(time_in_graph([lambda f=compiled: f(workspace)]))
        low_bits = int(workspace[WS_BARRIER].item()) & 0x7FFFFFFF
        if low_bits:
            raise RuntimeError(f"the barrier word's low bits are {low_bits} after the "
                               "replays, not 0")
    return measured


def measure_grid_barrier_us() -> float:
    """The cost of one grid barrier across one block per SM: the slope of time over barriers
    per launch (the intercept is the cooperative launch)."""
    blocks = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    times = [m.median_us for m in time_grid_barriers(blocks)]
    return slope_and_intercept(BARRIER_ROUNDS, times)[0]


def measure_ceilings() -> dict[str, float]:
    return {"copy_gbps": measure_copy_gbps(), "launch_floor_us": measure_launch_floor_us(),
            "grid_barrier_us": measure_grid_barrier_us()}
