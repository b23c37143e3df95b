"""The host time of each public op's fast path where no GPU is: the dispatcher made to serve a
function that does nothing for every signature the ops build, then, per op, a loop of the
public op on CPU tensors shaped like a one-token qwen3-30b-a3b decode step against a loop of
that function called directly (min of 7 rounds of 100000 calls each). What the op's own Python
costs this machine, to set beside the H200 host's (op_host_overhead.py, its no-launch column);
a shape read is timed alike.

    python3 benchmarks/fast_path_host.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import cutetune
from cutetune import dispatch
from cutetune.spaces.buckets import BUCKETS

CALLS, ROUNDS = 100_000, 7


def do_nothing(*arguments) -> None:
    return None


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


def main() -> None:
    served = dispatch.Dispatcher(None)
    dispatch._current = served
    calls = op_calls()
    # One call of each op through a table that remembers the signatures it is asked for, then
    # a plain table serving do_nothing under each of them at every bucket.
    served._fast_rows = asked = Remembering()
    for call, _ in calls.values():
        call()
    if len(asked.signatures) != len(calls):
        raise SystemExit(f"{len(asked.signatures)} signatures asked for by {len(calls)} ops: an "
                         "op no longer takes the fast path this script times")
    served._fast_rows = dict.fromkeys(asked.signatures, tuple(do_nothing for _ in BUCKETS))
    print(f"{'op':18s} added over the bare call")
    for op, (call, arguments) in calls.items():
        added = per_call_us(call) - per_call_us(lambda a=arguments: do_nothing(*a))
        print(f"{op:18s} {added:.3f} us", flush=True)
    t = torch.zeros(1, 2048)
    print(f"{'t.shape':18s} {per_call_us(lambda: t.shape):.3f} us")


class Remembering(dict):
    """A fast-rows table that serves do_nothing for any signature and remembers it."""

    def __init__(self):
        super().__init__()
        self.signatures: list[tuple] = []

    def get(self, signature, default=None):
        self.signatures.append(signature)
        return tuple(do_nothing for _ in BUCKETS)


if __name__ == "__main__":
    main()
