"""The host time of each public op's fast path where no GPU is: a dispatcher serving the fast
path's C++ function that does nothing (fast_path.do_nothing) at every bucket (the serving
table's seam for host time, Dispatcher.stand_in), with CPU tensors taken for CUDA ones, so that
each op's first call tells its route; then, for every op the registry holds
(cutetune.ops.registry) and every static problem of a one-token qwen3-30b-a3b decode step its
kernel has, a loop of the op's public calls (OpDef.calls) of the
kernel's inputs against a loop of that function called directly with the kernel's arguments
(min of 7 rounds of 100000 calls each). What the op's own Python and its route cost this
machine, to set beside the H200 host's (op_host_overhead.py, its no-launch column); a shape
read is timed alike. An op that prepares every call for its route (moe_dispatch, whose
workspace is a CUDA tensor) needs a GPU, and is left out.

    python3 -m benchmarks.fast_path_host
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from unittest import mock

import torch

from benchmarks.op_host_overhead import launch_arguments
from cutetune import fast_path
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.registry import NotApplicableError
from cutetune.ops.registry import ops
from cutetune.serving.table import Dispatcher
from cutetune.serving.warmup import set_current
from cutetune.spaces.models import load_model
from testkit.routed import routed

CALLS, ROUNDS = 100_000, 7
MODEL = "qwen3-30b-a3b"


def per_call_us(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        best = min(best, time.perf_counter() - start)
    return best / CALLS * 1e6


def op_calls() -> dict[str, tuple[Callable[[], object], tuple]]:
    """Each op's public calls of its kernel's CPU inputs for MODEL's problems at one token,
    with the arguments its compiled kernel would be given (those `kernel.launch` passes)."""
    shape = load_model(MODEL)
    calls: dict[str, tuple[Callable[[], object], tuple]] = {}
    for op in ops():
        if op.prepare is not None and op.output is None:
            continue
        try:
            problems = op.kernel.problems_for_model(shape, "bfloat16")
        except NotApplicableError:
            continue
        for static in problems:
            problem = static.with_tokens(1)
            tensors = op.kernel.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
            arguments = launch_arguments(op.kernel, tensors)
            for name, call in op.calls(tensors, problem).items():
                calls.setdefault(name, (call, arguments))
    return calls


@contextlib.contextmanager
def served(stand_in) -> Iterator[None]:
    """Meanwhile the current dispatcher serves `stand_in` at every bucket of every static
    problem, and CPU tensors are taken for CUDA ones (device 0)."""
    # The spec only picks the heuristic configs the stand-in is bound with.
    dispatcher = Dispatcher(DEVICE_SPECS["H200"])
    with mock.patch.object(torch.Tensor, "get_device", lambda self: 0), \
            dispatcher.stand_in(stand_in):
        set_current(dispatcher)
        try:
            yield
        finally:
            set_current(None)


def main() -> None:
    nothing = fast_path.do_nothing()
    with served(nothing):
        calls = op_calls()
        for op, (call, _) in calls.items():
            call()  # the checked path, which tells the op's route
            if not routed(call):
                raise SystemExit(f"{op} does not take the fast path this script times")
        print(f"{'op':26s} added over the bare call")
        for op, (call, arguments) in calls.items():
            added = per_call_us(call) - per_call_us(lambda a=arguments: nothing(*a))
            print(f"{op:26s} {added:.3f} us", flush=True)
    t = torch.zeros(1, 2048)
    print(f"{'t.shape':26s} {per_call_us(lambda: t.shape):.3f} us")


if __name__ == "__main__":
    main()
