"""The host time each public op adds over the bare compiled call (BENCHMARKS.md, "Host time per
call"): after `cutetune.warmup(MODEL)`, for each op of the registry (cutetune.ops.registry)
whose kernel the model uses, at one token (a decode step, where host time matters), a loop of
2000 of the op's public calls of its kernel's inputs (OpDef.calls: its route to the compiled
kernel, cutetune.fast_path) and a loop of 2000 bare calls of the compiled kernel
the dispatcher serves for that call, given its arguments positionally (those `kernel.launch`
passes it, read from the tensors once beforehand), each after 200 warm-up calls and ended by
one synchronize; the per-call difference is the op's cost. Each op's loop and its bare loop
alternate over 15 rounds, and the medians are printed. Then the same two loops with the
compiled kernel replaced by the fast path's C++ function that does nothing (at every bucket the
dispatcher serves, so in the routes too: Dispatcher.stand_in; and in the bare call): what the
op's own Python and its route cost this host when no launch runs between its calls. With
--units, the host cost of the single steps an op may take (an output allocation, a view, the
current stream, the dispatcher's lookup, the torch.compile check) is timed the same way.

    python3 -m benchmarks.op_host_overhead MODEL [--out overhead.csv] [--units units.csv]
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import time
from collections.abc import Callable

import torch

import cutetune
from cutetune import fast_path
from cutetune.kernels.registry import NotApplicableError
from cutetune.ops.registry import ops
from cutetune.spaces.models import load_model

CALLS, WARMUP_CALLS, ROUNDS = 2000, 200, 15


def launch_arguments(kernel, tensors: dict) -> tuple:
    """The positional arguments `kernel.launch` gives the compiled kernel for these tensors."""
    passed = []
    kernel.launch(lambda *arguments: passed.extend(arguments), tensors)
    return tuple(passed)


def per_call_us(call: Callable[[], object]) -> float:
    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--db", default=None, help="results database (default: the settings')")
    parser.add_argument("--out", default=None, help="CSV to write")
    parser.add_argument("--units", default=None,
                        help="also time the single host steps; CSV to write them to")
    args = parser.parse_args()
    dispatcher = cutetune.warmup(args.model, db_url=args.db)
    do_nothing = fast_path.do_nothing()
    device = torch.device("cuda")
    rows = []
    for op_def in ops():
        kernel = op_def.kernel
        try:
            problems = kernel.problems_for_model(load_model(args.model), "bfloat16")
        except NotApplicableError:
            continue
        for static in problems:
            problem = static.with_tokens(1)
            tensors = kernel.make_inputs(problem, device, torch.Generator(device).manual_seed(0))
            compiled = dispatcher.lookup(kernel, problem.static_tuple(), 1)
            arguments = launch_arguments(kernel, tensors)
            bare_call = functools.partial(compiled, *arguments)
            for op, call in op_def.calls(tensors, problem).items():
                bare, public = [], []
                for _ in range(ROUNDS):
                    bare.append(per_call_us(bare_call))
                    public.append(per_call_us(call))
                row = {"model": args.model, "op": op, "problem": problem.describe(),
                       "bare_us": round(statistics.median(bare), 3),
                       "op_us": round(statistics.median(public), 3)}
                row["added_us"] = round(row["op_us"] - row["bare_us"], 3)
                with dispatcher.stand_in(do_nothing):
                    nothing = functools.partial(do_nothing, *arguments)
                    row["added_unlaunched_us"] = round(statistics.median(
                        per_call_us(call) - per_call_us(nothing) for _ in range(ROUNDS)), 3)
                rows.append(row)
                print(f"{op:18s} bare {row['bare_us']:6.2f} us  op {row['op_us']:6.2f} us  "
                      f"added {row['added_us']:5.2f} us  (no launch: "
                      f"{row['added_unlaunched_us']:5.2f} us)  {row['problem']}", flush=True)
    if args.out:
        write_csv(args.out, rows)
    if args.units:
        write_csv(args.units, unit_costs(args.model, dispatcher, kernel, problem, tensors))


def unit_costs(model: str, dispatcher, kernel, problem, tensors: dict) -> list[dict]:
    """The host cost of each single step an op may take, on the last kernel's one-token
    inputs (each a loop as above, medians over the rounds)."""
    some = next(t for t in tensors.values() if t.dim() == 2)
    static = problem.static_tuple()
    steps = {
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "dispatcher lookup": lambda: dispatcher.lookup(kernel, static, 1),
        "torch.empty of a one-token row": lambda: torch.empty_like(some),
        "a view (t[:])": lambda: some[:],
        "torch.cuda.current_stream().cuda_stream":
            lambda: torch.cuda.current_stream().cuda_stream,
        "the raw current stream (torch._C._cuda_getCurrentRawStream)":
            lambda: torch._C._cuda_getCurrentRawStream(0),
        "t.get_device()": some.get_device,
        "t.shape": lambda: some.shape,
    }
    rows = []
    for step, call in steps.items():
        us = statistics.median(per_call_us(call) for _ in range(ROUNDS))
        rows.append({"model": model, "step": step, "us": round(us, 3)})
        print(f"{step:60s} {us:6.2f} us", flush=True)
    return rows


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
