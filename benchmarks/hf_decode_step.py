"""A decode step and a prefill of a Qwen3-MoE-shaped model (Qwen3-30B-A3B's layers, 2 by
default, random bf16 weights, a 4096-token vocabulary), unpatched against patched by
cutetune.integrations.transformers and against liger-kernel's patch, on one GPU.

    python3 -m benchmarks.hf_decode_step --layers 2 --out hf_decode_step.csv

The model is transformers' Qwen3MoeForCausalLM where the installed transformers is a release
the integration follows (`--model transformers`), else the plain-torch stand-in of the GPU tests
(testkit/qwen3_moe_standin.py: that computation under transformers' class names; `--model
standin`). A decode step is a (batch, 1) forward without a KV cache (the attention sees the
new token only), so it times the norms, projections, MoE layer and lm_head.

- decode, batch 1, 8, 64: unpatched eager; patched eager; patched replayed from a CUDA graph.
  The unpatched model cannot be captured: transformers' expert loop reads on the host which
  experts were hit.
- prefill, one sequence of 4096 tokens: unpatched and patched, eager.
- with the transformers model, after unpatching: liger-kernel's
  apply_liger_kernel_to_qwen3_moe (RoPE, RMSNorm, experts' SwiGLU; no loss kernels) on the
  same model, eager, and from a CUDA graph where liger's forward can be captured (else the
  note says why). liger patches transformers' modeling module for good: run it last.

Each figure is the median (and interquartile range) of --repeats calls timed with CUDA events,
after warm-up calls; every patched model's logits are compared with the unpatched model's on
the unpatched forward's routing (testkit/qwen3_moe_standin.py's routing_pinned: where a token's
router logits tie within bf16 rounding, the patched model's other rounding would send it to
other experts and change every later token).
Beside them, per case, the device time of one eager forward's kernels (torch.profiler's CUDA
activity, summed), unpatched and patched by cutetune, with the part cutetune's own kernels take
in the patched one: what the patch saves on the GPU and the share of the step left to it.
Prints a table; --out writes it as CSV.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path

import torch

from cutetune.device.measure import summarise, time_events
from cutetune.integrations.transformers import follows, patch, unpatch
from testkit.qwen3_moe_standin import (
    QWEN3_30B_A3B_LAYERS,
    StandinShape,
    build_standin,
    routing_pinned,
    transformers_or_stub,
)

DECODE_BATCHES = (1, 8, 64)
PREFILL_TOKENS = 4096


def time_us(call, repeats: int, warmup: int = 5) -> tuple[float, float]:
    """Median and interquartile range of `repeats` calls, in microseconds, each timed with
    its own event pair after `warmup` calls (the tuner's event timing)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    measured = summarise(time_events(call, repeats))
    return measured.median_us, measured.iqr_us


def graphed(forward, ids: torch.Tensor):
    """A replay of `forward(ids)` captured in a CUDA graph (after warm-up calls on the capture
    stream, which moe_dispatch's per-stream scratch needs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            forward(ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        forward(ids)
    return graph.replay


def installed_transformers_followed() -> bool:
    try:
        import transformers
    except ImportError:
        return False
    return follows(transformers.__version__)


def build_transformers_model(shape: StandinShape, device: str = "cuda"):
    """transformers' Qwen3MoeForCausalLM of `shape`, random weights, bf16 on `device`; its
    forward returns the logits."""
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        num_experts=shape.num_experts, num_experts_per_tok=shape.num_experts_per_tok,
        moe_intermediate_size=shape.moe_intermediate_size, intermediate_size=4 * shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers, rms_norm_eps=shape.rms_norm_eps,
        norm_topk_prob=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
    return model, lambda ids: model(ids, use_cache=False).logits


# CuTeDSL names every kernel it compiles so; in a model patched by cutetune, cutetune's are the
# only CuTeDSL kernels.
CUTEDSL_KERNEL_PREFIX = "kernel_cutlass"


def kernel_time_us(forward, ids: torch.Tensor) -> tuple[float, float]:
    """The device time of one forward's kernels and copies, and of cutetune's among them, in
    microseconds (torch.profiler, after one unprofiled forward)."""
    from torch.profiler import ProfilerActivity, profile

    forward(ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        forward(ids)
        torch.cuda.synchronize()
    return device_time_split(profiled.events())


def device_time_split(events) -> tuple[float, float]:
    """Summed durations (us) of the device events, and of those that are CuTeDSL kernels."""
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.time_range.elapsed_us() for e in on_device)
    ours = sum(e.time_range.elapsed_us() for e in on_device
               if e.name.startswith(CUTEDSL_KERNEL_PREFIX))
    return total, ours


def kernel_time_rows(variant: str, forward, inputs: dict) -> list[tuple]:
    rows = []
    for name, ids in inputs.items():
        total, ours = kernel_time_us(forward, ids)
        note = f"cutetune's kernels {ours:.1f} us ({100 * ours / total:.1f}%)" if ours else ""
        rows.append((name, f"{variant}, kernels' device time", total, float("nan"), note))
    return rows


def unpatched_outputs(model, forward, inputs: dict) -> dict:
    """Each input's logits from the unpatched model, with the routing its MoE routers chose."""
    outputs = {}
    for name, ids in inputs.items():
        with routing_pinned(model) as routing:
            outputs[name] = (forward(ids), routing)
    return outputs


def timed_rows(variant: str, model, forward, inputs: dict, unpatched: dict, repeats: int,
               graph: bool) -> list[tuple]:
    """The rows of one variant: eager for every case (with its largest logit difference from
    the unpatched model, on its routing), and replayed from a CUDA graph for the decode cases
    when `graph`."""
    rows = []
    for name, ids in inputs.items():
        logits, routing = unpatched[name]
        with routing_pinned(model, routing):
            diff = (forward(ids).float() - logits.float()).abs().max().item()
        us, iqr = time_us(lambda ids=ids: forward(ids), repeats)
        rows.append((name, f"{variant}, eager", us, iqr, f"max |logit diff| {diff:.3g}"))
        if graph and name.startswith("decode"):
            try:
                replay = graphed(forward, ids)
            except Exception as err:  # a patch whose forward syncs with the host
                rows.append((name, f"{variant}, CUDA graph", float("nan"), float("nan"),
                             f"not capturable: {str(err).splitlines()[0][:80]}"))
                continue
            us, iqr = time_us(replay, repeats)
            rows.append((name, f"{variant}, CUDA graph", us, iqr, ""))
    return rows


def liger_rows(model, forward, inputs: dict, unpatched: dict, repeats: int) -> list[tuple]:
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3_moe
    except ImportError as err:
        print(f"liger-kernel: not measured ({err})")
        return []
    apply_liger_kernel_to_qwen3_moe(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, model=model)
    return timed_rows("liger", model, forward, inputs, unpatched, repeats, graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--model", choices=("auto", "transformers", "standin"), default="auto",
                        help="auto: transformers' model where the installed release is one "
                             "the integration follows, else the stand-in")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kind = args.model
    if kind == "auto":
        kind = "transformers" if installed_transformers_followed() else "standin"
    shape = dataclasses.replace(QWEN3_30B_A3B_LAYERS, num_hidden_layers=args.layers)
    if kind == "transformers":
        model, forward = build_transformers_model(shape)
    else:
        transformers_or_stub()
        model = build_standin(torch.bfloat16, "cuda", shape)
        forward = model
    generator = torch.Generator("cuda").manual_seed(0)
    inputs = {f"decode batch {b}": torch.randint(0, shape.vocab_size, (b, 1), device="cuda",
                                                 generator=generator)
              for b in DECODE_BATCHES}
    inputs[f"prefill {PREFILL_TOKENS} tokens"] = torch.randint(
        0, shape.vocab_size, (1, PREFILL_TOKENS), device="cuda", generator=generator)
    rows = []
    with torch.no_grad():
        unpatched = unpatched_outputs(model, forward, inputs)
        for name, ids in inputs.items():
            us, iqr = time_us(lambda ids=ids: forward(ids), args.repeats)
            rows.append((name, "unpatched, eager", us, iqr, ""))
        rows += kernel_time_rows("unpatched", forward, inputs)
        print(patch(model))
        rows += timed_rows("cutetune", model, forward, inputs, unpatched, args.repeats,
                           graph=True)
        rows += kernel_time_rows("cutetune", forward, inputs)
        unpatch(model)
        if kind == "transformers":
            rows += liger_rows(model, forward, inputs, unpatched, args.repeats)
    header = ("case", "model", "median us", "IQR us", "note")
    print(f"{args.layers}-layer Qwen3-30B-A3B-shaped model ({kind}), bf16, "
          f"{torch.cuda.get_device_name()}")
    print(" | ".join(header))
    for case, variant, us, iqr, note in sorted(rows, key=lambda row: list(inputs).index(row[0])):
        print(f"{case} | {variant} | {us:.1f} | {iqr:.1f} | {note}")
    if args.out:
        with args.out.open("w", newline="") as f:
            csv.writer(f).writerows([header, *rows])


if __name__ == "__main__":
    main()
