"""The host time of each public op's fast path where no GPU is: a dispatcher made to serve the
fast path's C++ function that does nothing (fast_path.do_nothing) at every bucket, with CPU
tensors taken for CUDA ones, so that each op's first call tells its route; then, per op, a
loop of the public op on CPU tensors shaped like a one-token qwen3-30b-a3b decode step against
a loop of that function called directly with the kernel's arguments (min of 7 rounds of 100000
calls each). What the op's own Python and its route cost this machine, to set beside the H200
host's (op_host_overhead.py, its no-launch column); a shape read is timed alike.

    python3 benchmarks/fast_path_host.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import cutetune
from cutetune import dispatch, fast_path
from cutetune.dispatch import Dispatcher
from cutetune.spaces.buckets import BUCKETS

CALLS, ROUNDS = 100_000, 7


def per_call_us(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        best = min(best, time.perf_counter() - start)
    return best / CALLS * 1e6


def op_calls() -> dict[str, tuple[Callable[[], object], tuple]]:
    """Each op's call, with the arguments its compiled kernel would be given."""
    bf16, int32 = torch.bfloat16, torch.int32
    q, k = torch.zeros(1, 32, 128, dtype=bf16), torch.zeros(1, 4, 128, dtype=bf16)
    w = torch.zeros(128, dtype=bf16)
    x, residual, out = (torch.zeros(1, 2048, dtype=bf16) for _ in range(3))
    weight = torch.zeros(2048, dtype=bf16)
    gate_up, act = torch.zeros(1, 1536, dtype=bf16), torch.zeros(1, 768, dtype=bf16)
    expert_out = torch.zeros(8 + 128 * 15, 2048, dtype=bf16)
    row_of = torch.zeros(1, 8, dtype=int32)
    topk_weights, combined = torch.zeros(1, 8), torch.zeros(1, 2048, dtype=bf16)
    return {
        "qk_norm": (lambda: cutetune.qk_norm(q, k, w, w, eps=1e-6), (q, k, w, w)),
        "rmsnorm": (lambda: cutetune.rmsnorm(x, weight, eps=1e-6, out=out),
                    (x, x, weight, out)),
        "fused_add_rmsnorm": (lambda: cutetune.fused_add_rmsnorm(x, residual, weight,
                                                                 eps=1e-6, out=out),
                              (x, residual, weight, out)),
        "silu_and_mul": (lambda: cutetune.silu_and_mul(gate_up, out=act), (gate_up, act)),
        "moe_combine": (lambda: cutetune.moe_combine(expert_out, row_of, topk_weights,
                                                     combined, experts=128),
                        (expert_out, row_of, topk_weights, combined)),
    }


def serve(stand_in) -> None:
    """Make the current dispatcher one that serves `stand_in` at every bucket of every static
    problem, CPU tensors taken for CUDA ones."""

    def install(self, kernel, problem, warmed_up, key):
        self._rows[key] = tuple((stand_in, False) for _ in BUCKETS)
        return self._rows[key]

    Dispatcher._install = install
    torch.Tensor.get_device = lambda self: 0
    dispatch.set_current(Dispatcher(None))


def routed(call: Callable[[], object]) -> bool:
    """Whether a route launched the kernel in `call` (each route's call wrapped meanwhile)."""
    launched = []
    calls = {route: route.call for route in fast_path._ROUTES.values()}
    for route, route_call in calls.items():
        route.call = lambda *arguments, c=route_call: (r := c(*arguments),
                                                        launched.append(r))[0]
    try:
        call()
    finally:
        for route, route_call in calls.items():
            route.call = route_call
    return True in launched


def main() -> None:
    nothing = fast_path.do_nothing()
    serve(nothing)
    calls = op_calls()
    for op, (call, _) in calls.items():
        call()  # the checked path, which tells the op's route
        if not routed(call):
            raise SystemExit(f"{op} does not take the fast path this script times")
    print(f"{'op':18s} added over the bare call")
    for op, (call, arguments) in calls.items():
        added = per_call_us(call) - per_call_us(lambda a=arguments: nothing(*a))
        print(f"{op:18s} {added:.3f} us", flush=True)
    t = torch.zeros(1, 2048)
    print(f"{'t.shape':18s} {per_call_us(lambda: t.shape):.3f} us")


if __name__ == "__main__":
    main()
