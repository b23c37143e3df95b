"""The dispatcher's cost on the GPU: warmup time, and the host time per call that
`cutetune.qk_norm` (input checks + dispatcher lookup) adds over calling the compiled kernel.

    python benchmarks/qk_norm_dispatch_overhead.py --db sqlite:///tuned.db --model qwen3-8b
"""

from __future__ import annotations

import argparse
import time

import torch

import cutetune
from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model


def host_us(fn, n: int = 2000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    served = cutetune.warmup(args.model, kernels=["qk_norm"], db_url=args.db)
    warmup_s = time.perf_counter() - start
    static = qk.problems_for_model(load_model(args.model), "bfloat16")[0]
    t = qk.make_inputs(static, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
    compiled = qk.KERNEL.compile(static, qk.default_config(static, served.spec))
    direct = host_us(lambda: compiled(t["q"], t["k"], t["q_weight"], t["k_weight"]))
    via_op = host_us(lambda: cutetune.qk_norm(t["q"], t["k"], t["q_weight"], t["k_weight"],
                                              eps=static.eps))
    stats = served.stats["qk_norm"]
    print(f"{args.model}: warmup {warmup_s:.2f} s ({stats.compiles} compiles); host time per "
          f"call: compiled kernel {direct:.2f} us, cutetune.qk_norm {via_op:.2f} us "
          f"(dispatcher + input checks add {via_op - direct:.2f} us)")


if __name__ == "__main__":
    main()
