"""The cost of one grid barrier on this GPU: a cooperative kernel over the resident grid (one
block per SM) passes 0, 1, 2 and 4 barriers (moe_dispatch's `grid_barrier`), each timed in a
CUDA graph; the least-squares slope of time over barriers is the cost of one barrier, the
intercept the launch of a cooperative kernel. Also checks that the barrier word is back at its
starting low bits after every replay (the barrier re-arms itself).

    python3 -m benchmarks.grid_barrier_cost [--threads 128] [--blocks N]
"""

from __future__ import annotations

import argparse

import torch

from cutetune.device.ceilings import BARRIER_ROUNDS, slope_and_intercept, time_grid_barriers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=None,
                        help="cooperative grid (default: one block per SM)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    blocks = args.blocks or props.multi_processor_count
    measured = time_grid_barriers(blocks, args.threads)
    for rounds, m in zip(BARRIER_ROUNDS, measured, strict=True):
        print(f"{rounds} barriers: {m.median_us:.2f} us per launch (IQR {m.iqr_us:.2f})")
    per_barrier, launch = slope_and_intercept(BARRIER_ROUNDS, [m.median_us for m in measured])
    print(f"{props.name}, {blocks} blocks of {args.threads} threads: "
          f"{per_barrier:.2f} us per grid barrier (slope), {launch:.2f} us per cooperative "
          "launch without one (intercept)")


if __name__ == "__main__":
    main()
