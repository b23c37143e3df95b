"""The fused-add RMSNorm at 32768 tokens against torch.compile's Inductor kernel, under Nsight
Compute and side by side: our points (128-bit, 16 and 4 warps, evict_last_loads; 16 warps with
plain accesses) and the Inductor kernel of the same math.

With --profile, one call of each (after a warm-up call) runs between cudaProfilerStart and
cudaProfilerStop, for ncu's --profile-from-start off: each kernel alone, caches flushed before
it (ncu's default), so the report gives each one's duration, DRAM bytes and stalls in
isolation. Without it, the same candidates are checked and timed as `cutetune bench` times
them: back to back in CUDA graphs over rotated inputs, in interleaved rounds, twice.

    ncu --clock-control none --profile-from-start off --set full -o fused \
        python3 benchmarks/rmsnorm_fused_ncu.py --profile [--hidden 4096]
    ncu --import fused.ncu-rep --page raw --csv > fused.csv
    python3 benchmarks/rmsnorm_fused_ncu.py [--hidden 4096]
"""

from __future__ import annotations

import argparse

import torch

from cutetune.bench import Candidate, bench_problem, format_rows, ours_runner, torch_eager
from cutetune.dispatch import Dispatcher
from cutetune.kernels import cache_hints
from cutetune.kernels import rmsnorm as rms
from cutetune.tuner.ceilings import measure_copy_gbps
from cutetune.tuner.roofline import DEVICE_SPECS

SPEC = DEVICE_SPECS["H200"]
TOKENS = 32768
# (warps, hints) at 128 bits: the ninth run's tuned winner at hidden 4096, a 4-warp point of
# the same hint, and the winner's shape with plain accesses.
POINTS = ((16, cache_hints.EVICT_LAST_LOADS), (4, cache_hints.EVICT_LAST_LOADS),
          (16, cache_hints.NORMAL))


def candidates(problem: rms.RMSNormProblem) -> list[Candidate]:
    dispatcher = Dispatcher(SPEC)
    found = [Candidate(f"ours 128b {warps}w {hints}", ours_runner(
        rms.KERNEL, problem, rms.RMSNormConfig(rms.BLOCK_PER_ROW, 128, warps, hints),
        dispatcher), "") for warps, hints in POINTS]
    found.append(Candidate("torch.compile", torch.compile(torch_eager(rms.KERNEL, problem),
                                                          dynamic=False), ""))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--profile", action="store_true",
                        help="one call of each inside cudaProfilerStart/Stop (for ncu)")
    args = parser.parse_args()
    problem = rms.RMSNormProblem(num_tokens=TOKENS, dtype="bfloat16", out_dtype="bfloat16",
                                 hidden=args.hidden, eps=1e-6, weight_bias=0.0, fused_add=True)
    found = candidates(problem)
    if not args.profile:
        copy_gbps = measure_copy_gbps()
        for _ in range(2):
            print(format_rows(bench_problem(rms.KERNEL, problem, found, SPEC, copy_gbps)),
                  flush=True)
        return
    tensors = rms.KERNEL.make_inputs(problem, "cuda",
                                     torch.Generator(device="cuda").manual_seed(0))
    for candidate in found:  # compile and load outside the profiled range
        candidate.run(tensors)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for candidate in found:
        candidate.run(tensors)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(candidate.name for candidate in found))


if __name__ == "__main__":
    main()
