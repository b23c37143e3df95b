"""What the in-place residual costs RMSNorm's fused add against the peers at 64 and 512 rows:
ours (every block_per_row 128-bit point; outputs allocated per call, the residual updated in
place in each rotated input set, as vLLM's contract asks) beside ours with one residual shared
by every input set (so it stays in L2, as the new residual tensor each peer returns does in a
CUDA graph), and the peers; timed as `cutetune bench` times.

    python3 benchmarks/rmsnorm_fused_residual_probe.py
"""

from __future__ import annotations

import torch

from cutetune.bench import ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import rmsnorm as rms
from cutetune.tuner.measure import input_sets_for, time_in_graph
from cutetune.tuner.roofline import DEVICE_SPECS

SPEC = DEVICE_SPECS["H200"]


def main() -> None:
    for hidden in (4096, 8192):
        for rows in (64, 512):
            problem = rms.RMSNormProblem(num_tokens=rows, dtype="bfloat16",
                                         out_dtype="bfloat16", hidden=hidden, eps=1e-6,
                                         weight_bias=0.0, fused_add=True)
            default = rms.default_config(problem, SPEC)
            nbytes = rms.KERNEL.cost(problem, default, SPEC).bytes_moved
            generator = torch.Generator(device="cuda").manual_seed(1)
            sets = [rms.make_inputs(problem, "cuda", generator)
                    for _ in range(input_sets_for(nbytes, SPEC.l2_bytes))]
            times = {}
            for config in rms.SPACE.valid_points(problem, SPEC):
                if config.form != rms.BLOCK_PER_ROW or config.vector_bits != 128:
                    continue
                ours = ours_runner(rms.KERNEL, problem, config, Dispatcher(SPEC))
                times[f"ours {config.warps_per_block}w"] = time_in_graph(
                    [lambda t=t, run=ours: run(t) for t in sets]).median_us
            ours = ours_runner(rms.KERNEL, problem, default, Dispatcher(SPEC))
            shared = torch.zeros_like(sets[0]["residual"])
            times["ours default, one shared residual"] = time_in_graph(
                [lambda t=t, run=ours, r=shared: run({**t, "residual": r}) for t in sets]).median_us
            for peer in rms.KERNEL.peers:
                run = peer.build(problem)
                times[peer.name] = time_in_graph(
                    [lambda t=t, run=run: run(t) for t in sets]).median_us
            print(f"hidden={hidden} rows={rows} sets={len(sets)} default={default}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
