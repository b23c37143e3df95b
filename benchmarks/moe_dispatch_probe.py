"""Where moe_dispatch spends its time, timed the way `cutetune bench` times (a copy of the same
bytes and the empty kernel measured in the same run).

Decode (default): the fused form (one routing block, a grid barrier) against the replicated
form (every block routes, no barrier), with the padding rows zeroed or left alone, beside
moe_combine's default at the same sizes.

    python3 benchmarks/moe_dispatch_probe.py --out decode.csv qwen3-30b-a3b mixtral-8x7b

--prefill: the split and split_bulk forms' points at 4096 and 32768 tokens beside two ceilings
of the same size, a copy of the same bytes (half read, half written) and a write of the bytes
dispatch writes (torch's zero_), since dispatch writes K rows for every row it reads.

    python3 benchmarks/moe_dispatch_probe.py --prefill --out prefill.csv qwen3-30b-a3b
"""

from __future__ import annotations

import argparse
import csv
import dataclasses

import torch

from cutetune.bench import Candidate, bench_problem, format_rows, ours_runner
from cutetune.dispatch import Dispatcher
from cutetune.kernels import moe_combine as mc
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.dtypes import DTYPE_BYTES
from cutetune.spaces.models import PRESETS
from cutetune.tuner.ceilings import measure_copy_gbps, measure_launch_floor_us
from cutetune.tuner.measure import time_in_graph
from cutetune.tuner.roofline import device_spec_for

DECODE_TOKENS = (1, 8, 64, 128)
PREFILL_TOKENS = (4096, 32768)
# (policy, grid blocks, warps per block, tokens per block) worth comparing at each size.
DECODE_POINTS = ((md.FUSED, 128, 1, 1), (md.FUSED, 32, 1, 1), (md.FUSED, 128, 4, 1),
                 (md.REPLICATED, 128, 1, 1), (md.REPLICATED, 32, 4, 1),
                 (md.REPLICATED, 128, 4, 1), (md.REPLICATED, 128, 8, 1))
PREFILL_POINTS = ((md.SPLIT, 128, 8, 1), (md.SPLIT, 128, 8, 2), (md.SPLIT, 128, 8, 4),
                  (md.SPLIT, 128, 4, 2), (md.SPLIT, 32, 8, 2), (md.SPLIT_BULK, 128, 8, 1),
                  (md.SPLIT_BULK, 128, 8, 2), (md.SPLIT_BULK, 128, 8, 4))


def dispatch_candidates(problem, points, spec, dispatcher) -> list[Candidate]:
    bits = md.default_config(problem, spec).vector_bits
    found = []
    for policy, blocks, warps, tokens_per_block in points:
        config = md.MoEDispatchConfig(policy, blocks, warps, bits, tokens_per_block)
        reason = md.SPACE.first_violation(problem, config, spec)
        name = f"{policy} {blocks}x{warps}w t{tokens_per_block}"
        if reason is not None:
            found.append(Candidate(name, None, f"outside the space: {reason}"))
        else:
            found.append(Candidate(name, ours_runner(md.KERNEL, problem, config, dispatcher),
                                   ""))
    return found


def written_bytes(problem: md.MoEProblem) -> int:
    """What dispatch writes: every pair's row (uniform routing: all local here)."""
    return problem.num_tokens * problem.top_k * problem.hidden * DTYPE_BYTES[problem.dtype]


def csv_row(model: str, kernel: str, row) -> list:
    return [model, kernel, row.problem.num_tokens, row.problem.zero_padding,
            row.implementation, row.median_us, row.note]


def time_write_of(nbytes: int) -> float:
    buffers = [torch.empty(nbytes // 4, dtype=torch.int32, device="cuda") for _ in range(2)]
    return time_in_graph([lambda b=b: b.zero_() for b in buffers]).median_us


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefill", action="store_true")
    args = parser.parse_args()
    spec = device_spec_for(torch.cuda.get_device_name())
    dispatcher = Dispatcher(spec)
    copy_gbps = measure_copy_gbps()
    print(f"copy ceiling {copy_gbps:.0f} GB/s; empty kernel {measure_launch_floor_us():.2f} us",
          flush=True)
    rows = []
    for name in args.models:
        (static,) = md.KERNEL.problems_for_model(PRESETS[name], "bfloat16")
        for tokens in PREFILL_TOKENS if args.prefill else DECODE_TOKENS:
            for zero_padding in (False,) if args.prefill else (False, True):
                problem = dataclasses.replace(static.with_tokens(tokens),
                                              zero_padding=zero_padding)
                found = dispatch_candidates(
                    problem, PREFILL_POINTS if args.prefill else DECODE_POINTS, spec,
                    dispatcher)
                timed = bench_problem(md.KERNEL, problem, found, spec, copy_gbps)
                rows += [csv_row(name, "moe_dispatch", r) for r in timed]
                print(format_rows(timed), flush=True)
                if args.prefill:
                    write_us = time_write_of(written_bytes(problem))
                    rows.append([name, "write only", tokens, zero_padding, "write only",
                                 write_us, ""])
                    print(f"  write of the {written_bytes(problem)} bytes written: "
                          f"{write_us:.2f} us", flush=True)
            if not args.prefill:
                problem = static.with_tokens(tokens)
                config = mc.default_config(problem, spec)
                combine = bench_problem(mc.KERNEL, problem, [Candidate(
                    "combine default", ours_runner(mc.KERNEL, problem, config, dispatcher),
                    str(config))], spec, copy_gbps)
                rows += [csv_row(name, "moe_combine", r) for r in combine]
                print(format_rows(combine), flush=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "kernel", "tokens", "zero_padding", "implementation", "us",
                         "note"])
        writer.writerows(rows)


if __name__ == "__main__":
    main()
