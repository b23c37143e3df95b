"""Why liger's RMSNorm beat ours at 64-512 rows (H=4096, bf16; found later: ours was timed
writing cold outputs, see BENCHMARKS.md "Issue 3, fifth run"): the same points timed side by
side the way `cutetune bench` times them, then each launched eagerly on one L2-warm input set
so Nsight Compute can read the counters of single launches; --graph-nodes DIR captures ours
(the heuristic default) and each peer at 64 rows in a CUDA graph and prints the graph's nodes
(cudaGraphDebugDotPrint), to see what each launch puts in the graph.

    python3 benchmarks/rmsnorm_midsize_probe.py --time
    python3 benchmarks/rmsnorm_midsize_probe.py --graph-nodes /tmp/dots
    M=gpu__time_duration.sum,sm__cycles_active.max,smsp__inst_executed.sum,launch__grid_size
    M=$M,launch__block_size,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    for k in _rms_norm_forward rmsnorm_kernel; do    # liger's kernel, then ours
      ncu --clock-control none --cache-control none --kernel-name regex:$k --launch-skip 3 \\
          --launch-count 1 --metrics $M python3 benchmarks/rmsnorm_midsize_probe.py --eager
    done
"""

from __future__ import annotations

import argparse
import os

import torch
from cuda.bindings import runtime as cudart

from cutetune.bench import Candidate, bench_problem, format_rows, ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import rmsnorm as rms
from cutetune.tuner.ceilings import measure_copy_gbps
from cutetune.tuner.roofline import DEVICE_SPECS

SPEC = DEVICE_SPECS["H200"]
POINTS = (rms.RMSNormConfig("block_per_row", 128, 8), rms.RMSNormConfig("block_per_row", 64, 8),
          rms.RMSNormConfig("block_per_row", 128, 4), rms.RMSNormConfig("block_per_row", 128, 1))


def problem(rows: int) -> rms.RMSNormProblem:
    return rms.RMSNormProblem(num_tokens=rows, dtype="bfloat16", out_dtype="bfloat16",
                              hidden=4096, eps=1e-6, weight_bias=0.0, fused_add=False)


def candidates(p: rms.RMSNormProblem) -> list[Candidate]:
    dispatcher = Dispatcher(SPEC)
    found = [Candidate(f"ours {c.vector_bits}b x {c.warps_per_block}w",
                       ours_runner(rms.KERNEL, p, c, dispatcher), "") for c in POINTS]
    found += [Candidate(peer.name, peer.build(p), "") for peer in rms.KERNEL.peers]
    return found


def print_graph_nodes(out_dir: str) -> None:
    p = problem(64)
    device = torch.device("cuda")
    tensors = rms.make_inputs(p, device, torch.Generator(device=device).manual_seed(0))
    runs = {"ours": ours_runner(rms.KERNEL, p, rms.default_config(p, SPEC), Dispatcher(SPEC))}
    runs.update({peer.name.split()[0]: peer.build(p) for peer in rms.KERNEL.peers})
    for name, run in runs.items():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compiles and module loads stay out of the capture
            run(tensors)
            run(tensors)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            run(tensors)
        path = os.path.join(out_dir, f"{name}.dot")
        (err,) = cudart.cudaGraphDebugDotPrint(cudart.cudaGraph_t(graph.raw_cuda_graph()),
                                              path.encode(), 1)
        print(name, err)
        with open(path) as f:
            print(f.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--graph-nodes", metavar="DIR")
    args = parser.parse_args()
    if args.graph_nodes:
        print_graph_nodes(args.graph_nodes)
    if args.time:
        copy_gbps = measure_copy_gbps()
        for rows in (1, 64, 512):
            p = problem(rows)
            print(format_rows(bench_problem(rms.KERNEL, p, candidates(p), SPEC, copy_gbps)))
    if args.eager:
        p = problem(64)
        device = torch.device("cuda")
        tensors = rms.make_inputs(p, device, torch.Generator(device=device).manual_seed(0))
        for candidate in candidates(p):
            for _ in range(6):
                candidate.run(tensors)
            torch.cuda.synchronize()
            print(f"launched {candidate.name}", flush=True)


if __name__ == "__main__":
    main()
