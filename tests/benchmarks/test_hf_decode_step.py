"""benchmarks/hf_decode_step.py on the CPU: the held-out models are none the tests use; each
family's model is transformers' own class of the held-out config, cut to the benchmark's layers
and vocabulary, and the patch replaces every module of it; the rows it writes (fake timers and
captures for the GPU's), the routing its logits are compared on, and which profiler events its
device time sums."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
import torch
from torch.autograd.profiler_util import FunctionEvent

transformers = pytest.importorskip("transformers")

from benchmarks import benchmarks_md  # noqa: E402
from benchmarks import hf_decode_step as bench  # noqa: E402
from cutetune.integrations.transformers import patch  # noqa: E402
from cutetune.spaces.models import PRESET_NAMES, load_model, model_from_hf_config  # noqa: E402
from testkit.model_problems import HF_CONFIGS  # noqa: E402

# transformers' class per family (the integration's FAMILIES prefix, ForCausalLM).
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# Shapes every op accepts (testkit/tiny_hf_models.py's), for models run on the CPU.
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64)
TINY_EXTRA = {"qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64),
              "gemma3": dict(sliding_window=4, query_pre_attn_scalar=64)}
# The op each held-out model's attention rotates with, in one layer.
ATTENTION_OPS = {"llama": "rope", "qwen3": "qk_norm_rope", "qwen3_moe": "qk_norm_rope",
                 "gemma3": "qk_norm_rope"}
SETTINGS = bench.Settings(layers=2, vocab=128, batches=(1, 3), prefill=12, repeats=2, rounds=1)


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    return bench.build_model(bench.HELD_OUT[family], SETTINGS.layers, SETTINGS.vocab, "cpu",
                             SETTINGS.experts, seed, **TINY, **TINY_EXTRA.get(family, {}))


def dims(shape) -> tuple:
    return (shape.hidden_size, shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
            shape.intermediate_size, shape.num_experts, shape.expert_intermediate)


def test_every_family_has_a_held_out_model_of_a_shape_no_test_uses():
    assert set(bench.HELD_OUT) == set(CLASSES)
    tested = {dims(load_model(name)) for name in PRESET_NAMES}
    tested |= {dims(load_model(str(path))) for path in HF_CONFIGS.glob("*.json")}
    for held in bench.HELD_OUT.values():
        config = bench.model_config(held, held.config["num_hidden_layers"],
                                    held.config["vocab_size"])
        assert dims(model_from_hf_config(config.to_dict(), held.source)) not in tested, held


@pytest.mark.parametrize("family", CLASSES)
def test_the_model_is_transformers_own_class_cut_to_the_benchmarks_size_and_fully_patched(
        family):
    """On the meta device (shapes only), its memory then allocated untouched on the CPU but
    for the rotary module's frequencies, which patch checks (transformers' own initialisation
    of them): the held-out dims, the benchmark's layers and vocabulary, nothing the patch
    leaves alone, and the attention rotating with cutetune's op (Gemma 3's one layer is a
    full-attention one, its linear scaling rotated by qk_norm_rope too)."""
    held = bench.HELD_OUT[family]
    model = bench.build_model(held, 1, 4096, "meta", "grouped_mm")
    assert type(model).__name__ == CLASSES[family]
    assert model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == len(model.model.layers) == 1
    assert model.lm_head.out_features == 4096
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "head_dim",
                  "num_experts", "moe_intermediate_size"):
        assert getattr(model.config, field, None) == held.config.get(field), field
    if family == "qwen3_moe":
        assert bench.unpatched_description(model) == "attention sdpa, experts grouped_mm"
    if family == "gemma3":
        assert model.config.layer_types == ["full_attention"]
    model.to_empty(device="cpu")
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            model._init_weights(module)
    report = patch(model)
    assert report.left_alone == (), str(report)
    assert [e.op for e in report.entries if e.module.endswith("self_attn")] == [
        ATTENTION_OPS[family]]


def test_a_gemma3_of_two_layers_keeps_a_global_layer():
    config = bench.model_config(bench.HELD_OUT["gemma3"], 2, 4096)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.sliding_window == 1024


def test_the_cases_are_the_decode_batches_and_one_prefill():
    assert [(c.label, c.batch, c.seq_len) for c in bench.cases(bench.Settings())] == [
        ("decode batch 1", 1, 1), ("decode batch 8", 8, 1), ("decode batch 64", 64, 1),
        ("prefill 2048 tokens", 1, 2048)]


def fake_timer(calls, rounds, per_round):
    """Runs every call once; the unpatched side takes 10 us (eager) or 4 us (graph) per call,
    the patched 8 or 2."""
    us = {("unpatched", "eager"): 10.0, ("patched", "eager"): 8.0,
          ("unpatched", "CUDA graph"): 4.0, ("patched", "CUDA graph"): 2.0}
    for call in calls.values():
        call()
    return {key: [us[key[1:]]] * rounds * per_round for key in calls}


def replay_on_cpu(forward, ids):
    return lambda: forward(ids)


@pytest.mark.parametrize("family", CLASSES)
def test_the_rows_of_a_family(family, tmp_path):
    model = tiny_model(family)
    rows = bench.measure_family(bench.HELD_OUT[family], model, SETTINGS, device="cpu",
                                timer=fake_timer, capture=replay_on_cpu,
                                device_time=lambda forward, ids: (100.0, 30.0))
    assert [(r.case, r.batch, r.seq_len, r.mode) for r in rows] == [
        (case, batch, seq_len, mode)
        for case, batch, seq_len in (("decode batch 1", 1, 1), ("decode batch 3", 3, 1),
                                     ("prefill 12 tokens", 1, 12))
        for mode in ("eager", "CUDA graph")]
    for row in rows:
        assert (row.family, row.dims, row.layers, row.vocab) == (
            family, bench.HELD_OUT[family].source, 2, 128)
        assert row.transformers == transformers.__version__
        eager = row.mode == "eager"
        assert (row.unpatched_us, row.patched_us, row.speedup) == (
            (10.0, 8.0, 1.25) if eager else (4.0, 2.0, 2.0))
        assert row.unpatched_iqr_us == row.patched_iqr_us == 0.0
        # On the CPU the ops compute with their references: bf16 rounding apart.
        assert 0 <= row.max_logit_diff < 0.05
        assert row.note == ""
        device = (row.unpatched_device_us, row.patched_device_us, row.cutetune_device_us)
        assert device == (100.0, 100.0, 30.0) if eager else all(map(math.isnan, device))
    path = tmp_path / "rows.csv"
    bench.write_csv(rows, path)
    with path.open() as f:
        read = list(csv.DictReader(f))
    assert tuple(read[0]) == bench.COLUMNS
    assert [float(r["speedup"]) for r in read] == [r.speedup for r in rows]
    # BENCHMARKS.md's table reads the file as written.
    table = benchmarks_md.hf_drop_in_table(path)
    assert (f"| {family} | decode batch 3 | 10 | 8 | 1.25x | 100 / 100 (30) | 4 | 2 | 2.00x | "
            in "\n".join(table))


def test_a_side_that_cannot_be_captured_says_why():
    def capture(forward, ids):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\n"
                           "more detail")

    rows = bench.measure_family(bench.HELD_OUT["qwen3_moe"], tiny_model("qwen3_moe"), SETTINGS,
                                device="cpu", timer=fake_timer, capture=capture,
                                device_time=None)
    graph = [r for r in rows if r.mode == "CUDA graph"]
    assert len(graph) == 3
    for row in graph:
        assert math.isnan(row.unpatched_us) and math.isnan(row.patched_us)
        assert math.isnan(row.speedup)
        assert row.note == "; ".join(
            f"{side} not capturable: RuntimeError: CUDA error: operation not permitted when "
            "stream is capturing" for side in ("unpatched", "patched"))
    assert all(r.speedup == 1.25 and math.isnan(r.unpatched_device_us)
               for r in rows if r.mode == "eager")


def test_the_patched_logits_are_compared_on_the_unpatched_routing():
    """The patched copy's routers are given other weights: its own routing sends the tokens
    elsewhere, but compared on the unpatched model's routing its logits are the unpatched
    model's, bf16 rounding apart."""
    import copy

    model = tiny_model("qwen3_moe")
    patched = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in patched.named_parameters():
            if name.endswith("mlp.gate.weight"):
                parameter.copy_(20 * torch.randn_like(parameter))
    patch(patched)
    ids = torch.randint(0, SETTINGS.vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pinned = bench.logit_difference(model, patched, ids)
        unpinned = (bench.forward_of(patched)(ids) - bench.forward_of(model)(ids)).abs().max()
    assert pinned < 0.05 < unpinned


def test_repeats_are_capped():
    assert bench.repeats("200") == 200
    for text in ("0", "201"):
        with pytest.raises(Exception, match="not within 1..200"):
            bench.repeats(text)


def event(name: str, start_us: int, end_us: int, device_type=torch.autograd.DeviceType.CUDA):
    return FunctionEvent(id=start_us, name=name, thread=0, start_us=start_us, end_us=end_us,
                         device_type=device_type)


def test_the_device_time_sums_device_events_and_counts_cutedsl_kernels_as_cutetunes():
    events = [
        event("kernel_cutlass__rmsnorm_kernel_tensorptrbf16_0", 0, 3),
        event("nvjet_tst_128x64_64x4_2x1_v_bz_TNN", 3, 20),  # a cuBLAS GEMM
        event("kernel_cutlass_replicated_kernel_tensorptri32_0", 20, 25),
        event("Memcpy DtoD (Device -> Device)", 25, 26),
        event("aten::linear", 0, 30, torch.autograd.DeviceType.CPU),  # host side: not summed
    ]
    assert bench.device_time_split(events) == (26, 8)


def test_no_device_events_give_zero():
    assert bench.device_time_split(
        [event("aten::add", 0, 5, torch.autograd.DeviceType.CPU)]) == (0, 0)


def test_the_rows_columns_are_the_csvs():
    assert bench.COLUMNS[:10] == ("family", "dims", "layers", "vocab", "transformers",
                                  "unpatched_runs", "case", "batch", "seq_len", "mode")
    assert {f.name for f in dataclasses.fields(bench.Row)} == set(bench.COLUMNS)
