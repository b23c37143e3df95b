"""QK-norm on the GPU, side by side in one run: cutetune tuned vs the heuristic default vs
torch eager vs torch.compile vs quack's rmsnorm on the same head tensors; the copy ceiling and
an empty kernel's time measured in the same run; then the dispatcher's warmup time and per-call
host overhead.

    python benchmarks/qk_norm_bench.py --db sqlite:///tuned.db --out results.csv

Tuned configs are read from the DB (`cutetune tune qk_norm --model M --db ...` first); a bucket
with no winner is reported as such.
"""

from __future__ import annotations

import argparse
import csv
import json
import time

import torch

import cutetune
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.dtypes import FLOAT_TOLERANCE
from cutetune.results_db import Database, DeviceFingerprint, winners
from cutetune.spaces.buckets import bucket_of
from cutetune.spaces.models import load_model
from cutetune.tuner.ceilings import measure_copy_gbps, measure_launch_floor_us
from cutetune.tuner.measure import input_sets_for, time_in_graph
from cutetune.tuner.roofline import device_spec_for
from cutetune.tuner.verify import compare

MODELS = ("qwen3-8b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 512, 4096, 32768)


def torch_qk_norm(q, k, qw, kw, eps):
    def norm(x, w):
        xf = x.float()
        return (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
    return norm(q, qw), norm(k, kw)


def implementations(problem, tuned_config, spec):
    """name -> callable(tensors) returning (q_out, k_out)."""
    from quack.rmsnorm import rmsnorm_fwd

    eps = problem.eps
    impls = {}

    def cutetune_impl(config):
        compiled = qk.KERNEL.compile(problem, config)

        def run(t):
            qk.launch(compiled, t)
            return t["q"], t["k"]
        return run

    if tuned_config is not None:
        impls["cutetune tuned"] = cutetune_impl(tuned_config)
    impls["cutetune default"] = cutetune_impl(qk.default_config(problem, spec))
    impls["torch eager"] = lambda t: torch_qk_norm(t["q"], t["k"], t["q_weight"], t["k_weight"],
                                                   eps)
    compiled_torch = torch.compile(torch_qk_norm, fullgraph=True, dynamic=False)
    impls["torch.compile"] = lambda t: compiled_torch(t["q"], t["k"], t["q_weight"],
                                                      t["k_weight"], eps)

    def quack_impl(t):
        d = problem.head_dim
        q = rmsnorm_fwd(t["q"].view(-1, d), t["q_weight"], eps=eps)[0]
        k = rmsnorm_fwd(t["k"].view(-1, d), t["k_weight"], eps=eps)[0]
        return q.view_as(t["q"]), k.view_as(t["k"])
    impls["quack rmsnorm x2"] = quack_impl
    return impls


def contiguous_inputs(problem, generator):
    dtype = torch.bfloat16
    d = problem.head_dim
    q = torch.randn(problem.num_tokens, problem.q_heads, d, device="cuda", generator=generator)
    k = torch.randn(problem.num_tokens, problem.kv_heads, d, device="cuda", generator=generator)
    w = 1 + 0.5 * torch.randn(2, d, device="cuda", generator=generator)
    return {"q": q.to(dtype), "k": k.to(dtype), "q_weight": w[0].to(dtype),
            "k_weight": w[1].to(dtype)}


def bench_problem(problem, tuned_config, spec, copy_gbps):
    bytes_moved = qk.cost(problem, qk.default_config(problem, spec), spec).bytes_moved
    g = torch.Generator("cuda").manual_seed(problem.num_tokens)
    sets = [contiguous_inputs(problem, g) for _ in range(input_sets_for(bytes_moved,
                                                                      spec.l2_bytes))]
    rtol, atol = FLOAT_TOLERANCE[problem.dtype]
    # The tuner measures on q and k as views into one qkv tensor, the engine's layout (the
    # peers need contiguous tensors); time the tuned point on that layout too.
    view_sets = [qk.make_inputs(problem, torch.device("cuda"), g) for _ in sets]
    runs = [(name, run, sets) for name, run in
            implementations(problem, tuned_config, spec).items()]
    if tuned_config is not None:
        runs.insert(1, ("cutetune tuned, qkv views", runs[0][1], view_sets))
    rows = []
    for name, run, inputs in runs:
        check = {key: v.clone() for key, v in inputs[0].items()}
        expected = qk.reference(check, problem)
        q_out, k_out = run(check)
        torch.cuda.synchronize()
        compare(f"{name} q", q_out, expected["q"], rtol, atol)
        compare(f"{name} k", k_out, expected["k"], rtol, atol)
        m = time_in_graph([lambda t=t, run=run: run(t) for t in inputs])
        gbps = bytes_moved / (m.median_us * 1e-6) / 1e9
        rows.append({"tokens": problem.num_tokens, "impl": name, "us": m.median_us,
                     "iqr_us": m.iqr_us, "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps})
    return rows


def dispatcher_overhead(model, db_url):
    """Warmup seconds, and host us per call: the compiled kernel direct vs cutetune.qk_norm."""
    start = time.perf_counter()
    served = cutetune.warmup(model, kernels=["qk_norm"], db_url=db_url)
    warmup_s = time.perf_counter() - start
    static = qk.problems_for_model(load_model(model), "bfloat16")[0].with_tokens(1)
    t = qk.make_inputs(static, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
    compiled = qk.KERNEL.compile(static, qk.default_config(static, served.spec))

    def host_us(fn, n=2000):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    direct = host_us(lambda: compiled(t["q"], t["k"], t["q_weight"], t["k_weight"]))
    via_op = host_us(lambda: cutetune.qk_norm(t["q"], t["k"], t["q_weight"], t["k_weight"],
                                              eps=static.eps))
    return warmup_s, served.stats["qk_norm"], direct, via_op


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    # torch.compile specialises on every shape benchmarked here; let it keep them all.
    torch._dynamo.config.recompile_limit = 64
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    stored = winners(Database.open(args.db), fingerprint, "qk_norm")
    copy_gbps = measure_copy_gbps()
    empty_us = measure_launch_floor_us()
    print(f"{fingerprint.gpu_name}: copy ceiling {copy_gbps:.0f} GB/s, empty kernel "
          f"{empty_us:.2f} us per launch in a CUDA graph")
    all_rows = []
    for model in args.models.split(","):
        static = qk.problems_for_model(load_model(model), "bfloat16")[0]
        tuned = {w.bucket: qk.SPACE.config_from_dict(json.loads(w.config_json)) for w in stored
                 if w.static_key == static.static_key()}
        for n in map(int, args.tokens.split(",")):
            rows = bench_problem(static.with_tokens(n), tuned.get(bucket_of(n)), spec, copy_gbps)
            for r in rows:
                r["model"] = model
                r["config"] = json.dumps(tuned[bucket_of(n)].__dict__) if (
                    r["impl"].startswith("cutetune tuned")) else ""
            all_rows += rows
            print(f"\n{model} tokens={n}")
            for r in rows:
                print(f"  {r['impl']:<18} {r['us']:9.2f} us (IQR {r['iqr_us']:.2f})  "
                      f"{r['gbps']:7.0f} GB/s  {r['pct_copy']:5.1f}% of copy  {r['config']}")
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)
    for model in args.models.split(","):
        warmup_s, stats, direct, via_op = dispatcher_overhead(model, args.db)
        print(f"\n{model}: warmup {warmup_s:.2f} s ({stats.compiles} compiles); host time per "
              f"call: compiled kernel {direct:.2f} us, cutetune.qk_norm {via_op:.2f} us "
              f"(dispatcher + input checks add {via_op - direct:.2f} us)")


if __name__ == "__main__":
    main()
