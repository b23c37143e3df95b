"""silu_and_mul, bf16 I = 6144 at 1, 8 and 64 tokens: three points (32-bit vectors and 4 warps,
64-bit and 4 warps, the 128-bit 1-warp default) with plain and with streaming accesses, timed as
`cutetune bench` times them, in six interleaved rounds. Whether a decode-sized tuned point that
read slower in a bench than in the tuner is slower, or was caught by the GPU's timing drift
(BENCHMARKS.md, sixth run: I = 6144 at 8 tokens).

    python3 benchmarks/silu_hints_decode_probe.py
"""

from __future__ import annotations

import statistics

import torch

from cutetune.bench import ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import activation as act
from cutetune.kernels.registry import get_kernel
from cutetune.tuner.measure import input_sets_for, time_in_graph
from cutetune.tuner.roofline import DEVICE_SPECS

SPEC = DEVICE_SPECS["H200"]
POINTS = ((32, 1, 4), (128, 1, 1), (64, 1, 4))  # vector bits, vectors per thread, warps
ROUNDS = 6


def main() -> None:
    kernel = get_kernel("silu_and_mul")
    for tokens in (1, 8, 64):
        problem = act.SiluAndMulProblem(num_tokens=tokens, dtype="bfloat16", intermediate=6144)
        dispatcher = Dispatcher(SPEC)
        runs = {f"{bits}b v{per_thread} w{warps} {hints}":
                ours_runner(kernel, problem, act.ActivationConfig(bits, per_thread, warps, hints),
                            dispatcher)
                for bits, per_thread, warps in POINTS for hints in ("normal", "streaming")}
        nbytes = kernel.cost(problem, kernel.default_config(problem, SPEC), SPEC).bytes_moved
        generator = torch.Generator(device="cuda").manual_seed(1)
        sets = [kernel.bench_inputs(problem, "cuda", generator)
                for _ in range(input_sets_for(nbytes, SPEC.l2_bytes))]
        times = {name: [] for name in runs}
        for _ in range(ROUNDS):
            for name, run in runs.items():
                times[name].append(
                    time_in_graph([lambda t=t, run=run: run(t) for t in sets]).median_us)
        print(f"I=6144 tokens={tokens} sets={len(sets)}")
        for name, us in sorted(times.items(), key=lambda item: statistics.median(item[1])):
            print(f"  {name:28s} {statistics.median(us):6.2f}  "
                  + " ".join(f"{t:.2f}" for t in us), flush=True)


if __name__ == "__main__":
    main()
