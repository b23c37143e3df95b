"""A decode step and a prefill of a Qwen3-MoE-shaped model (Qwen3-30B-A3B's layers, 2 by
default, random bf16 weights, a 4096-token vocabulary), unpatched against patched by
cutetune.integrations.transformers, on one GPU.

    python3 benchmarks/hf_decode_step.py --layers 2 --out hf_decode_step.csv

The model is the plain-torch stand-in of the GPU tests (tests/qwen3_moe_standin.py: transformers
5.x's Qwen3-MoE computation under its class names), so the script runs where transformers is
not installed. The stand-in has no KV cache: a decode step is a (batch, 1) forward whose
attention sees the new token only, so it times the norms, projections, MoE layer and lm_head.

- decode, batch 1, 8, 64: unpatched eager; patched eager; patched replayed from a CUDA graph.
  The unpatched model cannot be captured: transformers' expert loop reads on the host which
  experts were hit (nonzero).
- prefill, one sequence of 4096 tokens: unpatched and patched, eager.

Each figure is the median (and interquartile range) of --repeats calls timed with CUDA events,
after warm-up calls; the patched model's logits are compared with the unpatched model's. Prints
a table; --out writes it as CSV.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from qwen3_moe_standin import (  # noqa: E402
    QWEN3_30B_A3B_LAYERS,
    build_standin,
    transformers_or_stub,
)

from cutetune.integrations.transformers import patch, unpatch  # noqa: E402

DECODE_BATCHES = (1, 8, 64)
PREFILL_TOKENS = 4096


def time_us(call, repeats: int, warmup: int = 5) -> tuple[float, float]:
    """Median and interquartile range of `repeats` calls, in microseconds."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    quartiles = statistics.quantiles(times, n=4)
    return statistics.median(times), quartiles[2] - quartiles[0]


def graphed(model, ids: torch.Tensor):
    """A replay of `model(ids)` captured in a CUDA graph (after warm-up calls on the capture
    stream, which moe_dispatch's per-stream scratch needs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        model(ids)
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    transformers_or_stub()
    shape = dataclasses.replace(QWEN3_30B_A3B_LAYERS, num_hidden_layers=args.layers)
    model = build_standin(torch.bfloat16, "cuda", shape)
    generator = torch.Generator("cuda").manual_seed(0)
    inputs = {f"decode batch {b}": torch.randint(0, shape.vocab_size, (b, 1), device="cuda",
                                                 generator=generator)
              for b in DECODE_BATCHES}
    inputs[f"prefill {PREFILL_TOKENS} tokens"] = torch.randint(
        0, shape.vocab_size, (1, PREFILL_TOKENS), device="cuda", generator=generator)
    rows = []
    with torch.no_grad():
        unpatched = {name: (time_us(lambda ids=ids: model(ids), args.repeats), model(ids))
                     for name, ids in inputs.items()}
        report = patch(model)
        print(report)
        for name, ids in inputs.items():
            (us, iqr), expected = unpatched[name]
            patched_logits = model(ids)
            diff = (patched_logits.float() - expected.float()).abs().max().item()
            rows.append((name, "unpatched, eager", us, iqr, ""))
            us, iqr = time_us(lambda ids=ids: model(ids), args.repeats)
            rows.append((name, "patched, eager", us, iqr, f"max |logit diff| {diff:.3g}"))
            if name.startswith("decode"):
                us, iqr = time_us(graphed(model, ids), args.repeats)
                rows.append((name, "patched, CUDA graph", us, iqr, ""))
        unpatch(model)
    header = ("case", "model", "median us", "IQR us", "note")
    print(f"{args.layers}-layer Qwen3-30B-A3B-shaped stand-in, bf16, "
          f"{torch.cuda.get_device_name()}")
    print(" | ".join(header))
    for case, variant, us, iqr, note in rows:
        print(f"{case} | {variant} | {us:.1f} | {iqr:.1f} | {note}")
    if args.out:
        with args.out.open("w", newline="") as f:
            csv.writer(f).writerows([header, *rows])


if __name__ == "__main__":
    main()
