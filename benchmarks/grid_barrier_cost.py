"""The cost of one grid barrier on this GPU: a cooperative kernel over the resident grid (one
block per SM) passes 0, 1, 2 and 4 barriers (moe_dispatch's `grid_barrier`), each timed in a
CUDA graph; the least-squares slope of time over barriers is the cost of one barrier, the
intercept the launch of a cooperative kernel. Also checks that the barrier word is back at its
starting low bits after every replay (the barrier re-arms itself).

    python3 -m benchmarks.grid_barrier_cost [--threads 128] [--blocks N]
"""

from __future__ import annotations

import argparse

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from cutetune.device.measure import time_in_graph
from cutetune.kernels.moe_dispatch.common import WS_BARRIER
from cutetune.kernels.moe_dispatch.device import grid_barrier
from cutetune.kernels.moe_dispatch.launcher import check_cooperative_grid

BARRIERS = (0, 1, 2, 4)


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
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    return slope, mean_y - slope * mean_x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=None,
                        help="cooperative grid (default: one block per SM)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    blocks = args.blocks or props.multi_processor_count
    check_cooperative_grid(blocks, args.threads, 32, 0, props)
    workspace = torch.zeros(64, dtype=torch.int32, device="cuda")
    fake = cute.runtime.make_fake_compact_tensor(cutlass.Int32, (64,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    times = []
    for rounds in BARRIERS:
        compiled = cute.compile(_barriers, fake, stream, rounds, blocks, args.threads,
                                options="--enable-tvm-ffi")
        measured = time_in_graph([lambda f=compiled: f(workspace)])
        low_bits = int(workspace[WS_BARRIER].item()) & 0x7FFFFFFF
        if low_bits:
            raise SystemExit(f"barrier word's low bits are {low_bits} after the replays, not 0")
        times.append(measured.median_us)
        print(f"{rounds} barriers: {measured.median_us:.2f} us per launch "
              f"(IQR {measured.iqr_us:.2f})")
    per_barrier, launch = slope_and_intercept(BARRIERS, times)
    print(f"{props.name}, {blocks} blocks of {args.threads} threads: "
          f"{per_barrier:.2f} us per grid barrier (slope), {launch:.2f} us per cooperative "
          "launch without one (intercept)")


if __name__ == "__main__":
    main()
