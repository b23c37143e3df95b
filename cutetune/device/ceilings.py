"""Ceilings measured on the device: copy bandwidth and the launch floor.

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


def measure_ceilings() -> dict[str, float]:
    return {"copy_gbps": measure_copy_gbps(), "launch_floor_us": measure_launch_floor_us()}
