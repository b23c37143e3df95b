"""Which cache hint the RMSNorm heuristic default should carry: the default point of each
preset width (plain and fused add, bf16) under each of the space's cache hints, checked and
timed side by side the way `cutetune bench` times candidates (interleaved rounds, rotated
inputs, outputs allocated per call), at decode and prefill token counts.

    python3 benchmarks/rmsnorm_default_hints_probe.py [--tokens 1,8,64,512,4096,32768]
        [--hidden 512,1536,2048,4096,5120,7168,8192]
"""

from __future__ import annotations

import argparse
import dataclasses

from cutetune.bench import Candidate, bench_problem, format_rows, ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import rmsnorm as rms
from cutetune.tuner.ceilings import measure_copy_gbps
from cutetune.tuner.roofline import DEVICE_SPECS

SPEC = DEVICE_SPECS["H200"]
# The preset widths (Qwen3, Llama-3.1-70B, DeepSeek-V3 and its 1536/512 norms).
HIDDEN = (512, 1536, 2048, 4096, 5120, 7168, 8192)


def candidates(problem: rms.RMSNormProblem, dispatcher: Dispatcher) -> list[Candidate]:
    default = rms.default_config(problem, SPEC)
    # bf16 rows in and out: every hint is valid at every vector width.
    return [Candidate(f"default {hints}", ours_runner(
        rms.KERNEL, problem, dataclasses.replace(default, cache_hints=hints), dispatcher), "")
            for hints in rms.CACHE_HINTS]


def preset_problems(description: str, tokens: str) -> list[rms.RMSNormProblem]:
    """The bf16 problems, plain and fused add, of each width and token count that --hidden
    (default: the preset widths) and --tokens (default: `tokens`) name, in that order; the
    command line is parsed here, before anything runs on the GPU."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", default=tokens)
    parser.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    args = parser.parse_args()
    return [rms.RMSNormProblem(num_tokens=count, dtype="bfloat16", out_dtype="bfloat16",
                               hidden=hidden, eps=1e-6, weight_bias=0.0, fused_add=fused_add)
            for hidden in (int(h) for h in args.hidden.split(","))
            for fused_add in (False, True)
            for count in (int(t) for t in args.tokens.split(","))]


def main() -> None:
    problems = preset_problems(__doc__.splitlines()[0], "1,8,64,512,4096,32768")
    copy_gbps = measure_copy_gbps()
    dispatcher = Dispatcher(SPEC)
    print(f"copy ceiling {copy_gbps:.0f} GB/s", flush=True)
    for problem in problems:
        rows = bench_problem(rms.KERNEL, problem, candidates(problem, dispatcher), SPEC,
                             copy_gbps)
        print(format_rows(rows), flush=True)


if __name__ == "__main__":
    main()
