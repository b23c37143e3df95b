"""The Hugging Face drop-in against transformers (issue 38 item 4), on one GPU: for each family
cutetune.integrations.transformers patches (llama, qwen3, qwen3_moe, gemma3), transformers' own
model class built from the config of a model the tests do not use (HELD_OUT), cut to --layers
decoder layers (2) and a --vocab-token vocabulary (4096), random bf16 weights; the unpatched
model against a copy of it patched by `patch`.

    python3 -m benchmarks.hf_decode_step --out OUT.csv

Cases: decode at batch 1, 8 and 64 (a (batch, 1) forward without a KV cache: the attention sees
the new token only, so a step times the norms, projections, MLP or MoE layer and lm_head) and a
prefill (one sequence of --prefill tokens, 2048). Each case is timed eagerly and replayed from a
CUDA graph, on both sides. The unpatched Qwen3-MoE runs its experts as transformers runs them
for a model built from a config: in 5.17 and 5.25 `grouped_mm` (tokens sorted by expert,
offsets by `histc`, grouped GEMMs: all on the device, so it can be captured); --experts eager
picks transformers' per-expert loop instead, which reads on the host which experts were hit and
cannot be captured. Where a side cannot be captured, its row says why.

The patched model is a deep copy of the unpatched one, patched once: both stay in memory
(twice the model: 2 layers of Qwen3-Coder-480B-A35B's are 31 GB each), so their calls
interleave in --rounds rounds, each side's block after warm-up calls (a drift of the clocks or
of the host falls on both alike), and no graph reads a weight a patch has since replaced. Each
call is timed with its own CUDA event pair after a synchronize: eager, that includes the host's
launches, as a step pays them. Each figure is the median (and interquartile range) of
--repeats calls (50, at most 200). The patched logits are compared with the unpatched ones on
the unpatched forward's routing (testkit/qwen3_moe_standin.py's routing_pinned: where a token's
router logits tie within bf16 rounding, the patched model's other rounding would send it to
other experts and change every later token). Beside the eager rows, the device time of one
forward's kernels (torch.profiler's CUDA activity, summed) on both sides, and the part
cutetune's kernels take in the patched one: a step's time above it is the host's.

Writes one CSV row per family, case and mode (COLUMNS; --out, rewritten after each family);
prints them as a table. Expected on one H200: about 3 minutes for the four families, at most 5
(the first run on a machine compiles each model's kernels in the patch's warmup, about 20 s a
family; the timed calls take a few seconds a family, a minute more with --repeats at its cap),
so one 10-minute call holds the run; --families splits it.
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import functools
import gc
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from cutetune.device.measure import summarise, time_events
from cutetune.integrations.transformers import patch
from testkit.qwen3_moe_standin import routing_pinned


@dataclass(frozen=True)
class HeldOut:
    """A family's model: the fields of its published config.json (its text config for Gemma 3)
    that shape the model, read by transformers' own config class."""

    family: str
    source: str
    config: dict


# Models no test uses (not among cutetune/spaces/presets nor tests/data/hf_configs, and of
# other shapes than those: tests/benchmarks/test_hf_decode_step.py checks it).
HELD_OUT = {held.family: held for held in (
    HeldOut("llama", "meta-llama/Llama-3.2-3B", dict(
        model_type="llama", hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=28, hidden_act="silu",
        rms_norm_eps=1e-5, vocab_size=128256, tie_word_embeddings=True,
        max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=32.0, high_freq_factor=4.0,
                          low_freq_factor=1.0, original_max_position_embeddings=8192))),
    HeldOut("qwen3", "Qwen/Qwen3-14B", dict(
        model_type="qwen3", hidden_size=5120, intermediate_size=17408, num_attention_heads=40,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=40, hidden_act="silu",
        rms_norm_eps=1e-6, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=40960, rope_theta=1000000.0)),
    HeldOut("qwen3_moe", "Qwen/Qwen3-Coder-480B-A35B-Instruct", dict(
        model_type="qwen3_moe", hidden_size=6144, intermediate_size=8192,
        moe_intermediate_size=2560, num_experts=160, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], num_attention_heads=96,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=62, hidden_act="silu",
        rms_norm_eps=1e-6, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=262144, rope_theta=10000000.0)),
    HeldOut("gemma3", "google/gemma-3-12b-it (text_config)", dict(
        model_type="gemma3_text", hidden_size=3840, intermediate_size=15360,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, num_hidden_layers=48,
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, rms_norm_eps=1e-6,
        vocab_size=262208, sliding_window=1024, sliding_window_pattern=6,
        max_position_embeddings=131072, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=dict(rope_type="linear", factor=8.0), final_logit_softcapping=None,
        attn_logit_softcapping=None)),
)}
EXPERTS_IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")
MAX_REPEATS = 200  # keeps the four families within one 10-minute call
MODES = ("eager", "CUDA graph")
SIDES = ("unpatched", "patched")


@dataclass(frozen=True)
class Settings:
    layers: int = 2
    vocab: int = 4096
    batches: tuple[int, ...] = (1, 8, 64)
    prefill: int = 2048
    repeats: int = 50
    rounds: int = 5
    experts: str = "grouped_mm"
    device_time: bool = True


@dataclass(frozen=True)
class Case:
    kind: str  # "decode" or "prefill"
    batch: int
    seq_len: int

    @property
    def label(self) -> str:
        return (f"decode batch {self.batch}" if self.kind == "decode"
                else f"prefill {self.seq_len} tokens")


def cases(settings: Settings) -> list[Case]:
    return ([Case("decode", b, 1) for b in settings.batches]
            + [Case("prefill", 1, settings.prefill)])


def model_config(held: HeldOut, layers: int, vocab: int, experts: str | None = None,
                 **dims):
    """transformers' config of `held`'s model (its own config class and defaults), cut to
    `layers` decoder layers and a `vocab`-token vocabulary; `dims` override fields (the tests'
    tiny models). Gemma 3's layers are all sliding-window but the last (the model's pattern
    has one global layer in six: two layers of it would have none)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = {**held.config, "num_hidden_layers": layers, "vocab_size": vocab, **dims}
    if held.family == "gemma3":
        fields["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    if experts is not None and "num_experts" in fields:
        fields["experts_implementation"] = experts
    return CONFIG_MAPPING[fields["model_type"]](**fields)


def build_model(held: HeldOut, layers: int, vocab: int, device, experts: str | None = None,
                seed: int = 0, **dims) -> torch.nn.Module:
    """transformers' causal LM of `held` (model_config), bf16, its own random initialisation
    (weights 0.02 around 0) with the norms spread around their start (so that a norm's weight
    used wrongly shows in the logits), on `device` (meta: shapes only, no initialisation)."""
    from transformers import AutoModelForCausalLM

    config = model_config(held, layers, vocab, experts, **dims)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    if torch.device(device).type != "meta":
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" in name:
                    parameter.add_(0.5 * torch.randn_like(parameter))
    return model


def forward_of(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda ids: model(ids, use_cache=False).logits


def unpatched_description(model: torch.nn.Module) -> str:
    """What transformers runs in the unpatched model: its attention, and its experts where it
    has them."""
    config = model.config
    text = f"attention {config._attn_implementation}"
    if getattr(config, "num_experts", None):
        text += f", experts {config._experts_implementation}"
    return text


def transferred(routing: dict, source: torch.nn.Module, target: torch.nn.Module) -> dict:
    """`routing` (routing_pinned's record on `source`'s routers) keyed by the routers of the
    same names in `target`, a copy of `source`."""
    return {target.get_submodule(name): routing[module]
            for name, module in source.named_modules() if module in routing}


def logit_difference(unpatched: torch.nn.Module, patched: torch.nn.Module,
                     ids: torch.Tensor) -> float:
    """The largest |logit| difference of `patched` from `unpatched` on `ids`, the MoE routers
    of both answering what the unpatched ones chose."""
    with routing_pinned(unpatched) as routing:
        expected = forward_of(unpatched)(ids)
    with routing_pinned(patched, transferred(routing, unpatched, patched)):
        got = forward_of(patched)(ids)
    return (got.float() - expected.float()).abs().max().item()


def graphed(forward: Callable, ids: torch.Tensor) -> Callable[[], None]:
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


def interleaved_times(calls: dict[Hashable, Callable[[], object]], rounds: int,
                      per_round: int, warmup: int = 2) -> dict[Hashable, list[float]]:
    """Per-call microseconds of every call, `per_round` of each per round, the calls taken in
    turn (the order reversed every other round), each block after `warmup` untimed calls."""
    times: dict[Hashable, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for round_ in range(rounds):
        for key in keys if round_ % 2 == 0 else reversed(keys):
            for _ in range(warmup):
                calls[key]()
            torch.cuda.synchronize()
            times[key] += time_events(calls[key], per_round)
    return times


# CuTeDSL names every kernel it compiles so; in a model patched by cutetune, cutetune's are the
# only CuTeDSL kernels.
CUTEDSL_KERNEL_PREFIX = "kernel_cutlass"


def kernel_time_us(forward: Callable, ids: torch.Tensor) -> tuple[float, float]:
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


@dataclass(frozen=True)
class Row:
    """One CSV row: a family's case in one mode, unpatched against patched."""

    family: str
    dims: str  # the model whose config gave the dims
    layers: int
    vocab: int
    transformers: str
    unpatched_runs: str  # unpatched_description
    case: str
    batch: int
    seq_len: int
    mode: str
    unpatched_us: float
    unpatched_iqr_us: float
    patched_us: float
    patched_iqr_us: float
    speedup: float  # unpatched_us / patched_us
    max_logit_diff: float
    unpatched_device_us: float = math.nan
    patched_device_us: float = math.nan
    cutetune_device_us: float = math.nan
    note: str = ""


COLUMNS = tuple(field.name for field in dataclasses.fields(Row))


def first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}"


def measure_family(held: HeldOut, unpatched: torch.nn.Module, settings: Settings, *,
                   device="cuda", timer=interleaved_times, capture=graphed,
                   device_time: Callable | None = kernel_time_us) -> list[Row]:
    """`held`'s rows: `unpatched` against a deep copy patched by cutetune, every case eagerly
    and replayed from a CUDA graph (`capture`), timed by `timer` (interleaved_times'
    signature); `device_time` (kernel_time_us' signature; None: not measured) beside the eager
    rows. The GPU's seams are arguments so that the tests run the rest on the CPU."""
    import transformers

    patched = copy.deepcopy(unpatched)
    report = patch(patched)
    print(report)
    left_alone = (f"the patch left {len(report.left_alone)} modules alone"
                  if report.left_alone else "")
    generator = torch.Generator(device).manual_seed(0)
    inputs = {case: torch.randint(0, settings.vocab, (case.batch, case.seq_len), device=device,
                                  generator=generator) for case in cases(settings)}
    models = dict(zip(SIDES, (unpatched, patched), strict=True))
    calls, not_captured, kernels = {}, {}, {}
    with torch.no_grad():
        diffs = {case: logit_difference(unpatched, patched, ids) for case, ids in inputs.items()}
        for case, ids in inputs.items():
            for side, model in models.items():
                forward = forward_of(model)
                if device_time is not None:
                    kernels[case, side] = device_time(forward, ids)
                calls[case, side, "eager"] = functools.partial(forward, ids)
                try:
                    calls[case, side, "CUDA graph"] = capture(forward, ids)
                except Exception as err:  # a forward that syncs with the host, or fails there
                    not_captured[case, side] = first_line(err)
        per_round = max(1, math.ceil(settings.repeats / settings.rounds))
        times = timer(calls, settings.rounds, per_round)
    summaries = {key: summarise(samples) for key, samples in times.items()}
    rows = []
    for case in inputs:
        for mode in MODES:
            measured = {side: summaries.get((case, side, mode)) for side in SIDES}
            us = {side: m.median_us if m else math.nan for side, m in measured.items()}
            iqr = {side: m.iqr_us if m else math.nan for side, m in measured.items()}
            notes = [f"{side} not capturable: {not_captured[case, side]}" for side in SIDES
                     if mode == "CUDA graph" and (case, side) in not_captured]
            device_us = {}
            if mode == "eager" and device_time is not None:
                device_us = dict(unpatched_device_us=kernels[case, "unpatched"][0],
                                 patched_device_us=kernels[case, "patched"][0],
                                 cutetune_device_us=kernels[case, "patched"][1])
            rows.append(Row(
                held.family, held.source, settings.layers, settings.vocab,
                transformers.__version__, unpatched_description(unpatched), case.label,
                case.batch, case.seq_len, mode, us["unpatched"], iqr["unpatched"],
                us["patched"], iqr["patched"], us["unpatched"] / us["patched"], diffs[case],
                **device_us, note="; ".join(filter(None, [*notes, left_alone]))))
    return rows


def write_csv(rows: Iterable[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)


def print_rows(rows: list[Row]) -> None:
    print("family | case | mode | unpatched us | patched us | speedup | max |logit diff| | "
          "device us unpatched / patched (cutetune's) | note")
    for r in rows:
        device = ("" if math.isnan(r.unpatched_device_us) else
                  f"{r.unpatched_device_us:.0f} / {r.patched_device_us:.0f} "
                  f"({r.cutetune_device_us:.0f})")
        print(f"{r.family} | {r.case} | {r.mode} | {r.unpatched_us:.1f} +- "
              f"{r.unpatched_iqr_us:.1f} | {r.patched_us:.1f} +- {r.patched_iqr_us:.1f} | "
              f"{r.speedup:.2f}x | {r.max_logit_diff:.3g} | {device} | {r.note}")


def repeats(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"{value} is not within 1..{MAX_REPEATS}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=tuple(HELD_OUT), default=list(HELD_OUT))
    parser.add_argument("--layers", type=int, default=Settings.layers)
    parser.add_argument("--vocab", type=int, default=Settings.vocab)
    parser.add_argument("--batches", type=int, nargs="+", default=list(Settings.batches))
    parser.add_argument("--prefill", type=int, default=Settings.prefill,
                        help="the prefill's tokens")
    parser.add_argument("--repeats", type=repeats, default=Settings.repeats,
                        help=f"timed calls per side, case and mode (at most {MAX_REPEATS})")
    parser.add_argument("--rounds", type=int, default=Settings.rounds)
    parser.add_argument("--experts", choices=EXPERTS_IMPLEMENTATIONS, default=Settings.experts,
                        help="transformers' experts implementation in the unpatched Qwen3-MoE")
    parser.add_argument("--no-device-time", action="store_true",
                        help="leave out the profiled device time of the eager forwards")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings(args.layers, args.vocab, tuple(args.batches), args.prefill, args.repeats,
                        args.rounds, args.experts, not args.no_device_time)
    print(f"{torch.cuda.get_device_name()}: {settings}")
    rows = []
    for family in args.families:
        held = HELD_OUT[family]
        model = build_model(held, settings.layers, settings.vocab, "cuda", settings.experts)
        rows += measure_family(held, model, settings,
                               device_time=kernel_time_us if settings.device_time else None)
        del model
        gc.collect()
        torch.cuda.empty_cache()
        print_rows([r for r in rows if r.family == family])
        if args.out:  # after each family: what was measured survives a later failure
            write_csv(rows, args.out)


if __name__ == "__main__":
    main()
