"""What one dependent global load costs a small kernel on this GPU: two kernels copy the same
rows (a block of 256 threads per row of HIDDEN bf16, 16-byte vectors), one reading each row's
index from global memory first, as moe_combine reads row_of before the expert rows it names,
the other taking the block's own number; both timed in one interleaved CUDA-graph run
(`time_interleaved`, as the tuner times points). The difference is that load's latency, to set
beside moe_combine's gap to a same-bytes copy at 1-64 tokens (benchmarks/targets.md).

    python3 -m benchmarks.dependent_load_latency [--hidden 2048 7168] [--tokens 1 8 64]
"""

from __future__ import annotations

import argparse
import functools

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Int32

from cutetune.device.measure import time_interleaved
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows

VEC, THREADS = 8, 256


@cute.kernel
def _copy_kernel(mSrc: cute.Tensor, mIdx: cute.Tensor, mDst: cute.Tensor,
                 DEPENDENT: cutlass.Constexpr[bool]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    row = bidx
    if cutlass.const_expr(DEPENDENT):
        row = mIdx[bidx]
    tSgS = cute.zipped_divide(mSrc[row, None], (VEC,))
    tDgD = cute.zipped_divide(mDst[bidx, None], (VEC,))
    vectors = cute.size(mDst, mode=[1]) // VEC
    for n in cutlass.range((vectors + THREADS - 1) // THREADS):
        col = n * THREADS + tidx
        if col < vectors:
            tDgD[(None, col)].store(tSgS[(None, col)].load())


@cute.jit
def _copy(mSrc: cute.Tensor, mIdx: cute.Tensor, mDst: cute.Tensor, stream: cuda.CUstream,
          DEPENDENT: cutlass.Constexpr[bool]):
    _copy_kernel(mSrc, mIdx, mDst, DEPENDENT).launch(
        grid=(cute.size(mDst, mode=[0]), 1, 1), block=(THREADS, 1, 1), stream=stream)


def compiled(hidden: int, dependent: bool):
    tokens, capacity = cute.sym_int(), cute.sym_int()
    return compile_launcher(_copy, (fake_rows(BFloat16, capacity, (hidden,), VEC, 16),
                                    fake_compact(Int32, (tokens,), 4),
                                    fake_rows(BFloat16, tokens, (hidden,), VEC, 16)),
                            (dependent,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 7168])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}: a row copy, with and without reading the row's "
          "index from global memory first (median us per launch)")
    print(f"{'hidden':>6} {'tokens':>6} {'copy':>8} {'dependent':>10} {'difference':>11}")
    for hidden in args.hidden:
        kernels = [compiled(hidden, dependent) for dependent in (False, True)]
        for tokens in args.tokens:
            src = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            index = torch.arange(tokens, dtype=torch.int32, device="cuda")
            dst = torch.empty_like(src)
            for kernel in kernels:
                kernel(src, index, dst)
                torch.testing.assert_close(dst, src, rtol=0, atol=0)
                dst.zero_()
            copy, dependent = time_interleaved([[functools.partial(k, src, index, dst)]
                                                for k in kernels])
            print(f"{hidden:>6} {tokens:>6} {copy.median_us:>8.2f} {dependent.median_us:>10.2f} "
                  f"{dependent.median_us - copy.median_us:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
