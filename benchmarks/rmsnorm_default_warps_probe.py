"""Is the RMSNorm heuristic default's block size right? The default point of each preset width
(plain and fused add, bf16) beside the same point with half and with twice its warps (one block
per row; the points the space allows), checked and timed side by side the way `cutetune bench`
times candidates (interleaved rounds, rotated inputs, outputs allocated per call).

    python3 benchmarks/rmsnorm_default_warps_probe.py [--tokens 1,8,16,64,128]
        [--hidden 512,1536,2048,4096,5120,7168,8192]
"""

from __future__ import annotations

import dataclasses

from rmsnorm_default_hints_probe import SPEC, preset_problems

from cutetune.bench import Candidate, bench_problem, ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import rmsnorm as rms
from cutetune.tuner.ceilings import measure_copy_gbps


def block_sizes(problem: rms.RMSNormProblem) -> list[rms.RMSNormConfig]:
    """The default point, then one block per row at half and at twice its warps, where valid."""
    default = rms.default_config(problem, SPEC)
    valid = set(rms.SPACE.valid_points(problem, SPEC))
    points = [default]
    for warps in (default.warps_per_block // 2, default.warps_per_block * 2):
        point = dataclasses.replace(default, form=rms.BLOCK_PER_ROW, warps_per_block=warps)
        if point in valid and point not in points:
            points.append(point)
    return points


def main() -> None:
    problems = preset_problems(__doc__.splitlines()[0], "1,8,16,64,128")
    copy_gbps = measure_copy_gbps()
    dispatcher = Dispatcher(SPEC)
    print(f"copy ceiling {copy_gbps:.0f} GB/s; us per call, the default first", flush=True)
    for problem in problems:
        found = [Candidate(f"{point.form} {point.warps_per_block}w", ours_runner(
            rms.KERNEL, problem, point, dispatcher), "") for point in block_sizes(problem)]
        rows = bench_problem(rms.KERNEL, problem, found, SPEC, copy_gbps)
        cells = ", ".join(f"{row.implementation} {row.median_us:.2f}" for row in rows
                          if row.median_us is not None)
        print(f"hidden {problem.hidden} fused_add={problem.fused_add} tokens "
              f"{problem.num_tokens}: {cells}", flush=True)


if __name__ == "__main__":
    main()
