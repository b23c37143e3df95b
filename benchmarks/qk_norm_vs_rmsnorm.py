"""The specialised QK-norm against our regular RMSNorm on the same head tensors (the comparison
the published design makes: it reports 2-3x for its QK-norm).

QK-norm: one in-place launch over q and k, as the dispatcher serves it from the DB (tuned
winners where `cutetune tune qk_norm` stored them). RMSNorm: q viewed as (tokens * q_heads,
head_dim) and k as (tokens * kv_heads, head_dim), two launches, each at its best point among
every valid RMSNorm config (timed here, so the regular kernel is tuned too). Same input sets,
same CUDA-graph timing.

    python3 -m benchmarks.qk_norm_vs_rmsnorm --db sqlite:///tuned.db --out qk_vs_rms.csv
"""

from __future__ import annotations

import argparse
import csv

import torch

from cutetune.device.measure import input_sets_for, time_in_graph
from cutetune.device.specs import device_spec_for
from cutetune.kernels import qk_norm as qk
from cutetune.kernels import rmsnorm as rms
from cutetune.results_db import Database, DeviceFingerprint, winners
from cutetune.serving.table import Dispatcher
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json

MODELS = ("qwen3-8b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 512, 4096, 32768)


def rows_problem(problem: qk.QKNormProblem, heads: int) -> rms.RMSNormProblem:
    return rms.RMSNormProblem(num_tokens=problem.num_tokens * heads, dtype=problem.dtype,
                              out_dtype=problem.dtype, hidden=problem.head_dim,
                              eps=problem.eps, weight_bias=problem.weight_bias, fused_add=False)


def rms_launches(sets, name: str, weight: str, problem: rms.RMSNormProblem, compiled):
    """One RMSNorm launch per input set, over `name` viewed as rows, out of place."""
    launches = []
    for t in sets:
        rows = t[name].view(-1, problem.hidden)
        tensors = {"x": rows, "residual": rows, "weight": t[weight],
                   "out": torch.empty_like(rows)}
        launches.append(lambda tensors=tensors: rms.launch(compiled, tensors))
    return launches


def best_rms_point(sets, name, weight, problem, spec, dispatcher):
    timed = []
    for config in rms.SPACE.valid_points(problem, spec):
        compiled = dispatcher.compiled(rms.KERNEL, problem, config)
        us = time_in_graph(rms_launches(sets, name, weight, problem, compiled)).median_us
        timed.append((us, config, compiled))
    return min(timed, key=lambda entry: entry[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    dispatcher = Dispatcher(spec, winners(Database.open(args.db), fingerprint))
    device = torch.device("cuda")
    results = []
    for model in MODELS:
        static = qk.problems_for_model(load_model(model), "bfloat16")[0]
        for n in TOKENS:
            problem = static.with_tokens(n)
            bytes_moved = qk.cost(problem, qk.default_config(problem, spec), spec).bytes_moved
            generator = torch.Generator(device=device).manual_seed(n)
            sets = [qk.contiguous_inputs(problem, device, generator)
                    for _ in range(input_sets_for(bytes_moved, spec.l2_bytes))]
            entry = dispatcher.plan.entry_for(qk.KERNEL, problem)
            compiled = dispatcher.compiled(qk.KERNEL, problem, entry.config)
            qk_us = time_in_graph([lambda t=t, c=compiled: qk.launch(c, t)
                                   for t in sets]).median_us
            q_rows, k_rows = rows_problem(problem, static.q_heads), rows_problem(
                problem, static.kv_heads)
            _, q_config, q_compiled = best_rms_point(sets, "q", "q_weight", q_rows, spec,
                                                     dispatcher)
            _, k_config, k_compiled = best_rms_point(sets, "k", "k_weight", k_rows, spec,
                                                     dispatcher)
            pair = [launch for q_launch, k_launch in zip(
                rms_launches(sets, "q", "q_weight", q_rows, q_compiled),
                rms_launches(sets, "k", "k_weight", k_rows, k_compiled), strict=True)
                for launch in (q_launch, k_launch)]
            # Two launches per set: the per-launch time doubled is the time per q+k norm.
            rms_us = 2 * time_in_graph(pair).median_us
            results.append({
                "model": model, "tokens": n, "qk_norm_us": qk_us, "qk_norm_source": entry.source,
                "qk_norm_config": config_to_json(entry.config), "rmsnorm_x2_us": rms_us,
                "rmsnorm_q_config": config_to_json(q_config),
                "rmsnorm_k_config": config_to_json(k_config),
                "qk_norm_speedup": rms_us / qk_us,
                "qk_norm_gbps": bytes_moved / (qk_us * 1e-6) / 1e9,
            })
            r = results[-1]
            print(f"{model:<14} tokens={n:<6} qk_norm {qk_us:8.2f} us ({entry.source})  "
                  f"rmsnorm q+k {rms_us:8.2f} us  speedup {r['qk_norm_speedup']:.2f}x",
                  flush=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)


if __name__ == "__main__":
    main()
