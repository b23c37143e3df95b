"""split dispatch's routing grid, count exchange and copy cache hints, side by side
(BENCHMARKS.md, issue 4, eighth run), and split_block_ranks beside them (ninth run).

For each MODEL:TOKENS, split's points at 8 warps per block and 1 or 2 tokens per block, over the
routing grids of the space, the copy's cache hints (normal, streaming) and both ways the routing
blocks exchange their counts: as `publishes_counts` chooses (published where blocks x (local
experts + 1) fit PUBLISHED_COUNT_WORDS) and, where that is published, the atomic exchange too at
one token per block (compiled with `publishes_counts` answering no). Then split_block_ranks'
valid points over the same grids, at 4 and 8 warps, every tokens per block of the space (1 to 4;
3 is split_block_ranks' own, issue 4's tenth run) and streaming hints (its routing blocks
exchange nothing: the copy resolves their ranks, "in copy"). The heuristic default's point is
marked. Every point is checked against the reference first (three calls on each of three input
sets), then all are timed as `cutetune bench` times (CUDA graphs over rotated input sets,
interleaved rounds), twice, beside a copy of the same bytes.

    python3 benchmarks/moe_dispatch_split_probe.py mixtral-8x7b:4096 qwen3-30b-a3b:512 \
        [--compile-only]
"""

from __future__ import annotations

import sys

import torch
from moe_dispatch_parts import cold_input_sets

from cutetune.kernels import cache_hints
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.moe_common import check_dispatch
from cutetune.spaces.models import PRESETS

GRIDS = md.SPLIT_GRIDS
TOKENS_PER_BLOCK = next(p.choices for p in md.SPACE.params if p.name == "tokens_per_block")
HINTS = (cache_hints.NORMAL, cache_hints.STREAMING)
WARPS = 8
BLOCK_RANKS_WARPS = (4, 8)


def chosen_exchange(problem: md.MoEProblem, config: md.MoEDispatchConfig) -> str:
    if config.policy == md.SPLIT_BLOCK_RANKS:
        return "in copy"
    published = md.publishes_counts(problem.local_experts, config.grid_blocks)
    return "published" if published else "atomic"


def compile_points(problem: md.MoEProblem, spec) -> dict:
    """(config, exchange) -> compiled op, exchange being "published" or "atomic"."""
    compiled = {}
    for grid in GRIDS:
        for tokens_per_block in (1, 2):
            for hints in HINTS:
                config = md.MoEDispatchConfig(md.SPLIT, grid, WARPS, 128, tokens_per_block,
                                              hints)
                if md.SPACE.first_violation(problem, config, spec) is not None:
                    continue
                exchange = chosen_exchange(problem, config)
                compiled[(config, exchange)] = md.KERNEL.compile(problem, config)
                if exchange == "published" and tokens_per_block == 1:
                    chooser = md.publishes_counts
                    md.publishes_counts = lambda local_experts, routing_blocks: False
                    try:
                        compiled[(config, "atomic")] = md.KERNEL.compile(problem, config)
                    finally:
                        md.publishes_counts = chooser
    for grid in GRIDS:
        for warps in BLOCK_RANKS_WARPS:
            for tokens_per_block in TOKENS_PER_BLOCK:
                config = md.MoEDispatchConfig(md.SPLIT_BLOCK_RANKS, grid, warps, 128,
                                              tokens_per_block, cache_hints.STREAMING)
                if md.SPACE.first_violation(problem, config, spec) is None:
                    compiled[(config, "in copy")] = md.KERNEL.compile(problem, config)
    return compiled


def main() -> None:
    problems = []
    for arg in (a for a in sys.argv[1:] if not a.startswith("--")):
        model, tokens = arg.split(":")
        (static,) = md.KERNEL.problems_for_model(PRESETS[model], "bfloat16")
        problems.append((model, static.with_tokens(int(tokens))))
    compile_only = "--compile-only" in sys.argv
    from cutetune.tuner.roofline import DEVICE_SPECS, device_spec_for

    spec = DEVICE_SPECS["H200"] if compile_only else device_spec_for(torch.cuda.get_device_name())
    compiled = {(model, problem): compile_points(problem, spec) for model, problem in problems}
    if compile_only:
        print("compiled", sum(len(points) for points in compiled.values()))
        return
    from cutetune.tuner.ceilings import measure_copy_gbps, time_copy_of
    from cutetune.tuner.measure import time_interleaved

    ceiling = measure_copy_gbps()
    for (model, problem), points in compiled.items():
        _, nbytes, sets = cold_input_sets(problem, next(iter(points))[0])
        default = md.default_config(problem, spec)
        for op in points.values():
            for t in sets[:3]:
                for _ in range(3):
                    md.launch(op, t)
                torch.cuda.synchronize()
                check_dispatch({name: t[name] for name in md.KERNEL.outputs},
                               md.reference(t, problem), problem)
        copy_us = time_copy_of(nbytes, spec.l2_bytes).median_us
        launches = [[lambda t=t, op=op: md.launch(op, t) for t in sets] for op in points.values()]
        for round_ in (1, 2):
            print(f"{model}, {problem.num_tokens} tokens, round {round_}: copy ceiling "
                  f"{ceiling:.0f} GB/s, {nbytes / 1e6:.1f} MB, a copy of the same bytes "
                  f"{copy_us:.2f} us, 85% of the ceiling {nbytes / (0.85 * ceiling * 1e3):.2f} us")
            for ((config, exchange), m) in zip(points, time_interleaved(launches), strict=True):
                chosen = config == default and exchange == chosen_exchange(problem, config)
                mark = "  (default)" if chosen else ""
                print(f"  {config.policy:17s} {config.grid_blocks:3d}x{config.warps_per_block}w "
                      f"t{config.tokens_per_block} {config.cache_hints:9s} {exchange:9s} "
                      f"{m.median_us:8.2f} us {nbytes / m.median_us / 1e3 / ceiling:6.1%}{mark}",
                      flush=True)


if __name__ == "__main__":
    main()
