"""cutetune.integrations.transformers on tiny random-weight models of each family it patches,
built from a config (no download), on the CPU, where the ops compute with their kernels' fp32
references: the patched model's logits match the unpatched model's, every op it claims to use
runs, unpatch gives back the very modules and the same logits, and the patched model compiles
as one graph."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cutetune.integrations import hf_forwards  # noqa: E402
from cutetune.integrations import transformers as integration  # noqa: E402
from cutetune.integrations.transformers import NotPatchableError, patch, unpatch  # noqa: E402
from testkit.tiny_hf_models import (  # noqa: E402
    COMMON,
    FAMILIES,
    ROUTER_SHARPNESS,
    TOKENS,
    TOLERANCE,
    VOCAB,
    build,
    kv_cache_argument,
    logits,
)


class OpCalls:
    """Counts the calls of each op the installed forwards make (not patch's zero-token calls,
    which only run the ops' input checks)."""

    def __init__(self, monkeypatch):
        self.counts: dict[str, int] = {}
        for name in ("rmsnorm", "fused_add_rmsnorm", "qk_norm", "qk_norm_rope", "rope",
                     "moe_dispatch", "moe_combine"):
            monkeypatch.setattr(hf_forwards, name, self._counting(name, getattr(hf_forwards, name)))
        activations = {act: (op_name, self._counting(op_name, op))
                       for act, (op_name, op) in integration.ACTIVATIONS.items()}
        monkeypatch.setattr(integration, "ACTIVATIONS", activations)

    def _counting(self, name, op):
        def counted(*args, **kwargs):
            if args[0].shape[0]:
                self.counts[name] = self.counts.get(name, 0) + 1
            return op(*args, **kwargs)
        return counted


# Per family, the ops one forward of the 2-layer model calls (bf16, where every module is
# served): per layer one input norm, one fused add + norm, the rotary embedding (with the q/k
# norm where the family has one); the final norm; Gemma's post-attention and post-feedforward
# norms.
EXPECTED_CALLS = {
    "llama": {"rmsnorm": 3, "fused_add_rmsnorm": 2, "rope": 2, "silu_and_mul": 2},
    "qwen3": {"rmsnorm": 3, "fused_add_rmsnorm": 2, "qk_norm_rope": 2, "silu_and_mul": 2},
    "qwen3_moe": {"rmsnorm": 3, "fused_add_rmsnorm": 2, "qk_norm_rope": 2, "moe_dispatch": 2,
                  "silu_and_mul": 2, "moe_combine": 2},
    "gemma3": {"rmsnorm": 7, "fused_add_rmsnorm": 2, "qk_norm_rope": 2,
               "gelu_and_mul(tanh)": 2},
}
# The op that rotates q and k in each family's attention.
ROTATES = {"llama": "rope", "qwen3": "qk_norm_rope", "qwen3_moe": "qk_norm_rope",
           "gemma3": "qk_norm_rope"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_logits_match_and_unpatch_restores_the_model(family, dtype, monkeypatch):
    model = build(family, dtype)
    modules = dict(model.named_modules())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = logits(model)
    calls = OpCalls(monkeypatch)
    report = patch(model)
    assert report.replaced and "skipped: the model is on cpu" in report.warmup
    got = logits(model)
    torch.testing.assert_close(got, expected, **TOLERANCE[dtype])
    want = dict(EXPECTED_CALLS[family])
    if family == "qwen3_moe" and dtype == torch.float32:
        # moe_dispatch moves bf16/fp16 only: the MoE blocks (and so their experts' activation)
        # are left alone, with its reason.
        del want["moe_dispatch"], want["moe_combine"], want["silu_and_mul"]
        left = {e.module: e.note for e in report.left_alone}
        assert list(left) == ["model.layers.0.mlp", "model.layers.1.mlp"]
        assert "float32" in left["model.layers.0.mlp"], left
    assert calls.counts == want
    assert list(model.state_dict()) == list(state)

    unpatch(model)
    assert not any("cutetune" in name for name, _ in model.named_buffers())
    assert dict(model.named_modules()) == modules  # the same objects, under the same names
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert torch.equal(logits(model), expected)


def _entries(report):
    return {(e.module, e.op, e.replaced) for e in report.entries}


def test_report_names_what_each_family_serves():
    report = patch(build("gemma3", torch.bfloat16))
    entries = _entries(report)
    assert ("model.layers.0", "fused_add_rmsnorm", True) in entries
    assert ("model.layers.0.self_attn", "qk_norm_rope", True) in entries
    assert ("model.layers.1.self_attn", "qk_norm_rope", True) in entries
    assert ("model.layers.0.mlp", "gelu_and_mul(tanh)", True) in entries
    assert ("model.layers.1.post_feedforward_layernorm", "rmsnorm", True) in entries
    # Folded into the layer's and the attention's forwards, so no entry of their own.
    assert not any(m.endswith(("pre_feedforward_layernorm", "q_norm", "k_norm"))
                   for m, _, _ in entries)
    text = str(report)
    assert text.startswith("cutetune patch of a Gemma3 model: 13 modules replaced, 0 left alone")
    assert "residual add after attention fused into pre_feedforward_layernorm" in text
    assert "model.layers.*.self_attn" in text  # the layers' rows are one row each

    assert "q_norm, k_norm and RoPE (theta 10000) in one launch, in place" in text
    assert "q_norm, k_norm and RoPE (theta 1e+06) in one launch, in place" in text

    entries = _entries(patch(build("llama", torch.bfloat16)))
    assert not any(op.startswith("qk_norm") for _, op, _ in entries)  # Llama has no q/k norm
    assert ("model.layers.0.self_attn", "rope", True) in entries
    assert ("model.layers.1", "fused_add_rmsnorm", True) in entries


def test_unsupported_shapes_are_left_alone_with_the_ops_reason():
    # head_dim 32 (qk_norm takes 64, 128, 256); intermediate 100 bf16 (200 bytes, not a multiple
    # of 16); hidden 128 is fine, so the layers' norms are served.
    model = build("qwen3", torch.bfloat16, head_dim=32, intermediate_size=100)
    expected = logits(model)
    report = patch(model)
    left = {e.module: e.note for e in report.left_alone}
    assert left["model.layers.0.self_attn"] == ("head_dim 32 is not supported: use one of "
                                                "(64, 128, 256)")
    assert left["model.layers.1.mlp"].startswith("the intermediate width 100 must be a multiple "
                                                 "of 16 bytes")
    # The q/k norms' own modules are then left to the plain norm, which refuses 32 too.
    assert left["model.layers.0.self_attn.q_norm"] == ("hidden size 32 is not supported: use "
                                                       "64 to 16384")
    assert "left alone  head_dim 32 is not supported" in str(report)
    torch.testing.assert_close(logits(model), expected, **TOLERANCE[torch.bfloat16])


def test_a_hidden_size_the_norm_kernel_refuses_leaves_the_norms_and_layers_alone():
    model = build("llama", torch.float32, hidden_size=48, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=24)
    expected = logits(model)
    report = patch(model)
    reason = "hidden size 48 is not supported: use 64 to 16384"
    left = {e.module: e.note for e in report.left_alone}
    assert left["model.layers.0"] == reason and left["model.norm"] == reason
    assert {e.op for e in report.replaced} == {"silu_and_mul", "rope"}
    torch.testing.assert_close(logits(model), expected, **TOLERANCE[torch.float32])


def test_experts_not_all_held_here_leave_the_moe_block_alone():
    # As when the model is sharded by expert: layer 0's experts hold 4 of the router's 8.
    model = build("qwen3_moe", torch.bfloat16)
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj[:4].clone())
    report = patch(model)
    left = {e.module: e.note for e in report.left_alone}
    assert left == {"model.layers.0.mlp": "the experts' gate_up_proj is (4, 128, 128), not "
                                          "(8, 128, 128): not every routed expert's weights "
                                          "are stacked here"}
    assert ("model.layers.1.mlp", "moe_dispatch, silu_and_mul, moe_combine",
            True) in _entries(report)


def test_the_patched_moe_model_still_records_its_router_logits():
    model = build("qwen3_moe", torch.bfloat16)
    expected = logits_and_router(model)
    patch(model)
    got = logits_and_router(model)
    assert len(got) == len(expected) == 2
    # The second layer's router reads hidden states rounded in other places, and its logits are
    # the sharpened router's: the bf16 tolerance, scaled by the sharpening.
    tolerance = dict(rtol=TOLERANCE[torch.bfloat16]["rtol"],
                     atol=ROUTER_SHARPNESS * TOLERANCE[torch.bfloat16]["atol"])
    for router_logits, want in zip(got, expected, strict=True):
        torch.testing.assert_close(router_logits, want, **tolerance)


def logits_and_router(model) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids, use_cache=False, output_router_logits=True).router_logits


def test_an_unknown_family_is_one_error_and_nothing_changes():
    config = transformers.MistralConfig(**COMMON)
    model = transformers.MistralForCausalLM(config).eval()
    with pytest.raises(NotPatchableError, match=r"cannot patch MistralForCausalLM \(model_type "
                                                r"'mistral'\): it patches llama, qwen3, "
                                                r"qwen3_moe, gemma3, gemma3_text models"):
        patch(model)
    assert not any("forward" in vars(m) for m in model.modules())
    assert integration.patch_report(model) is None


def test_patching_twice_or_unpatching_an_unpatched_model_is_an_error():
    model = build("llama", torch.float32)
    with pytest.raises(NotPatchableError, match="not patched"):
        unpatch(model)
    report = patch(model)
    assert integration.patch_report(model) is report
    with pytest.raises(NotPatchableError, match="already patched"):
        patch(model)
    unpatch(model)
    patch(model)  # and again after unpatching


@pytest.mark.parametrize("family", FAMILIES)
def test_decoding_with_the_kv_cache_matches(family):
    """Greedy generation goes through the attention's cache path (the patched forward updates
    the cache itself) and rotates by the positions generate gives each row (the second prompt
    is left-padded by 2); fp32, where the patched model computes what transformers
    computes."""
    model = build(family, torch.float32)
    prompt = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(prompt)
    prompt[1, :2], mask[1, :2] = 0, 0
    settings = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        patch(model)
        got = model.generate(prompt, **settings)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_patched_model_compiles_as_one_graph_of_cutetune_ops(family):
    """fullgraph=True fails on a graph break; the backend records the graph torch.compile
    traced and runs it (the custom ops' eager implementation is the CPU path)."""
    model = build(family, torch.bfloat16)
    patch(model)
    eager = logits(model)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording_backend)
    got = logits(compiled)
    assert len(graphs) == 1
    called = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    for op in EXPECTED_CALLS[family]:
        op = op.removesuffix("(tanh)").replace("fused_add_rmsnorm", "rmsnorm")
        assert any(f"cutetune.{op}" in target for target in called), (op, called)
    torch.testing.assert_close(got, eager, **TOLERANCE[torch.bfloat16])


def _prefill_then_decode(model, dtype):
    """The logits of a prefill of 5 tokens into transformers' KV cache, then of one decode step,
    the two sequences of the batch at positions 3 apart (as left padding sets them), the
    second's step 4 positions past its prefill's end: RoPE turns a shift common to a row's
    queries and keys into nothing, so only the step's own distance from its row's cached keys
    shows that the rotation reads each row's own positions."""
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=generator)
    step = torch.randint(0, VOCAB, (2, 1), generator=generator)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        prefill = model(prompt, position_ids=torch.arange(5)[None] + torch.tensor([[0], [3]]),
                        **kv_cache_argument(model, cache), use_cache=True).logits
        decode = model(step, position_ids=torch.tensor([[5], [12]]),
                       **kv_cache_argument(model, cache), use_cache=True).logits
    return prefill, decode


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_decode_step_after_a_prefill_matches_with_the_fused_rotary_embedding(
        family, dtype, monkeypatch):
    model = build(family, dtype)
    expected = _prefill_then_decode(model, dtype)
    report = patch(model)
    attentions = [e for e in report.entries if e.module.endswith("self_attn")]
    assert [(e.op, e.replaced) for e in attentions] == [(ROTATES[family], True)] * 2
    calls = OpCalls(monkeypatch)
    got = _prefill_then_decode(model, dtype)
    assert calls.counts[ROTATES[family]] == 4  # two layers, two forwards
    for got_logits, want in zip(got, expected, strict=True):
        torch.testing.assert_close(got_logits, want, **TOLERANCE[dtype])


def test_the_report_names_the_op_that_rotates_each_familys_attention():
    for family, op in ROTATES.items():
        report = patch(build(family, torch.bfloat16))
        # One row per note: Gemma 3's two kinds of layer rotate with two thetas.
        rows = [line for line in str(report).splitlines() if "self_attn" in line]
        assert rows and all(f"  {op}  " in row and "  replaced  " in row for row in rows), rows


# transformers' rope parameters of other scalings (Llama 3's own; YaRN; Gemma 3's full-attention
# layers' linear scaling), over a context long enough that a wrong frequency shows.
LLAMA3 = dict(rope_type="llama3", factor=8.0, rope_theta=500000.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=512)
YARN = dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
            original_max_position_embeddings=512)
GEMMA3_LINEAR = {"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                 "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6)}
CONTEXT = 4096


def _rotary_tables(model, rows: int = CONTEXT) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """transformers' cos and sin of positions 0 to rows - 1, per cos/sin cache the patch
    would add (keyed by its name): the rotary module's forward."""
    rotary = model.model.rotary_emb
    x = torch.zeros(1, dtype=model.dtype)
    positions = torch.arange(rows)[None]
    kinds = getattr(rotary, "layer_types", None)
    if kinds is None:
        return {hf_forwards.COS_SIN_CACHE: rotary(x, positions)}
    return {f"{hf_forwards.COS_SIN_CACHE}_{kind}": rotary(x, positions, kind) for kind in kinds}


@pytest.mark.parametrize(("family", "rope"), [
    ("llama", None), ("llama", LLAMA3), ("llama", YARN), ("qwen3", None), ("qwen3_moe", None),
    ("gemma3", None), ("gemma3", GEMMA3_LINEAR)], ids=[
    "llama", "llama-llama3", "llama-yarn", "qwen3", "qwen3_moe", "gemma3", "gemma3-linear"])
def test_the_cos_sin_cache_holds_transformers_cos_and_sin(family, rope):
    """The rows the kernels read (or compute alike) are the cos and sin transformers' rotary
    module gives each position, for every kind of layer the patch rotates; fp32, to a few
    fp32 rounding errors of transformers' own angle at position 4095."""
    overrides = {"max_position_embeddings": CONTEXT}
    if rope is not None:
        overrides["rope_parameters"] = rope
    model = build(family, torch.float32, **overrides)
    tables = _rotary_tables(model)
    patch(model)
    _assert_caches_hold(model, tables, CONTEXT, atol=1e-3)


def _assert_caches_hold(model, tables: dict, rows: int, atol: float) -> None:
    """Every cos/sin cache the patch added holds `rows` rows, the cos and sin of `tables`
    (_rotary_tables') for each kind of layer."""
    caches = {name: buffer for name, buffer in model.model.rotary_emb.named_buffers()
              if name.startswith(hf_forwards.COS_SIN_CACHE)}
    assert set(caches) == set(tables)
    for name, (cos, sin) in tables.items():
        half = cos.shape[-1] // 2
        assert caches[name].shape == (rows, 2 * half)
        torch.testing.assert_close(caches[name], torch.cat((cos[0, :, :half], sin[0, :, :half]),
                                                           dim=-1), rtol=0, atol=atol)


@pytest.mark.parametrize("rope", [LLAMA3, YARN], ids=["llama3", "yarn"])
def test_llamas_scaled_rotary_embeddings_are_served_by_rope(rope):
    model = build("llama", torch.float32, rope_parameters=rope,
                  max_position_embeddings=CONTEXT)
    # Positions far into the context, where the scaled frequencies differ from theta's.
    ids = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(TOKENS)[None] + torch.tensor([[1000], [3000]])
    expected = logits(model, ids, position_ids=positions)
    report = patch(model)
    assert {(e.op, e.replaced) for e in report.entries if e.module.endswith("self_attn")} == {
        ("rope", True)}
    # transformers' fp32 angles at position 3000 are a few 1e-4 radians off the exact ones.
    torch.testing.assert_close(logits(model, ids, position_ids=positions), expected,
                               rtol=1e-3, atol=1e-3)


def test_gemma3s_linearly_scaled_layers_are_served_by_qk_norm_rope():
    """Gemma 3 4B to 27B scale the full-attention layers' frequencies linearly: both kinds of
    layer normalise and rotate q and k in one launch, each kind by its own rotation, at
    positions far into the context, where the scaled frequencies differ from theta's."""
    model = build("gemma3", torch.float32, rope_parameters=GEMMA3_LINEAR,
                  max_position_embeddings=CONTEXT)
    ids = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(TOKENS)[None] + torch.tensor([[1000], [3000]])
    expected = logits(model, ids, position_ids=positions)
    report = patch(model)
    attentions = {e.module: (e.op, e.replaced, e.note) for e in report.entries
                  if e.module.endswith("self_attn")}
    assert attentions == {
        "model.layers.0.self_attn": ("qk_norm_rope", True, "q_norm, k_norm and RoPE (theta "
                                     "10000) in one launch, in place"),
        "model.layers.1.self_attn": ("qk_norm_rope", True, "q_norm, k_norm and RoPE (theta "
                                     "1e+06, linear scaling) in one launch, in place")}
    # transformers' fp32 angles at position 3000 are a few 1e-4 radians off the exact ones.
    torch.testing.assert_close(logits(model, ids, position_ids=positions), expected,
                               rtol=1e-3, atol=1e-3)


def test_a_scaling_the_fused_op_does_not_compute_keeps_transformers_rope():
    """qk_norm_rope computes no YaRN: Qwen3 with YaRN normalises q and k in one launch and
    rotates them with transformers' apply_rotary_pos_emb; the report says why."""
    model = build("qwen3", torch.bfloat16, rope_parameters=YARN)
    expected = _prefill_then_decode(model, torch.bfloat16)
    report = patch(model)
    notes = {(e.op, e.replaced, e.note) for e in report.entries if e.module.endswith("self_attn")}
    assert notes == {("qk_norm", True, "q_norm and k_norm in one launch; RoPE by transformers: "
                      "the yarn scaling is not one qk_norm_rope computes (default, llama3, "
                      "linear)")}
    for got, want in zip(_prefill_then_decode(model, torch.bfloat16), expected, strict=True):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])

    # Llama has no q/k norm to keep: its attention is left alone, with the reason.
    llama = build("llama", torch.bfloat16, rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                 rope_theta=10000.0))
    left = {e.module: e.note for e in patch(llama).left_alone}
    assert left == {f"model.layers.{i}.self_attn": "model llama scales its frequencies "
                    "(dynamic), which rope does not compute yet" for i in (0, 1)}


# A context the tests below decode past: its cos/sin caches start at these rows.
SHORT_CONTEXT = 64


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize(("family", "rope"), [
    ("llama", None), ("llama", LLAMA3), ("qwen3", None), ("gemma3", GEMMA3_LINEAR)],
    ids=["llama", "llama-llama3", "qwen3", "gemma3-linear"])
def test_decoding_past_max_position_embeddings_matches(family, rope, cache):
    """A generate of 10 tokens after a prompt of 60 runs past max_position_embeddings (64),
    where transformers' rotary module keeps computing: the cos/sin caches grow before the
    first step whose positions may pass their rows (to 128: twice theirs), so every step's
    logits are transformers'. The bound is the KV cache's length plus the query's, or, for a
    static cache (which counts on the device), its capacity. (On the CPU the ops compute from
    the positions, not the cache: the grown caches' rows are checked against transformers'
    cos and sin.)"""
    overrides = {"max_position_embeddings": SHORT_CONTEXT}
    if rope is not None:
        overrides["rope_parameters"] = rope
    model = build(family, torch.float32, **overrides)
    prompt = torch.randint(1, VOCAB, (2, 60), generator=torch.Generator().manual_seed(4))
    settings = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, output_logits=True,
                    return_dict_in_generate=True, cache_implementation=cache)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        tables = _rotary_tables(model, 2 * SHORT_CONTEXT)
        patch(model)
        _assert_caches_hold(model, {name: (cos[:, :SHORT_CONTEXT], sin[:, :SHORT_CONTEXT])
                                    for name, (cos, sin) in tables.items()},
                            SHORT_CONTEXT, atol=1e-5)
        got = model.generate(prompt, **settings)
    assert torch.equal(got.sequences, expected.sequences)
    for got_logits, want in zip(got.logits, expected.logits, strict=True):
        torch.testing.assert_close(got_logits, want, **TOLERANCE[torch.float32])
    _assert_caches_hold(model, tables, 2 * SHORT_CONTEXT, atol=1e-5)


def test_the_cos_sin_cache_grows_only_past_its_rows_and_never_in_a_capture(monkeypatch):
    model = build("llama", torch.float32, max_position_embeddings=SHORT_CONTEXT)
    patch(model)
    rotation = _installed_rotation(model)
    held = rotation.rows_for(SHORT_CONTEXT)
    assert held is getattr(model.model.rotary_emb, hf_forwards.COS_SIN_CACHE)
    # Past its rows by far: to the bound itself, its rows as cos_sin_table gives them.
    grown = rotation.rows_for(1000)
    assert grown.shape == (1000, 64) and torch.equal(grown[:SHORT_CONTEXT], held)
    assert getattr(model.model.rotary_emb, hf_forwards.COS_SIN_CACHE) is grown
    assert rotation.rows_for(1000) is grown
    # Inside a CUDA graph capture it cannot allocate: refused, naming the remedy.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert rotation.rows_for(1000) is grown
    with pytest.raises(RuntimeError, match="positions up to 1000 pass the 1000 rows of "
                                           "cutetune's cos/sin cache .* inside a CUDA graph "
                                           "capture, where it cannot grow: run a step of that "
                                           "length eagerly before capturing"):
        rotation.rows_for(1001)


def _installed_rotation(model) -> hf_forwards.Rotation:
    """The Rotation the patch bound into a patched Llama's first attention's forward."""
    forward = model.model.layers[0].self_attn.forward
    return forward.keywords["rotate"].keywords["rotation"]


def test_a_model_cast_after_loading_keeps_transformers_rope():
    """model.to(bf16) rounds the rotary module's fp32 frequencies, and transformers rotates by
    the rounded ones, which no theta gives: the attention rotates with transformers' rope."""
    model = build("qwen3", torch.float32).to(torch.bfloat16)
    expected = logits(model)
    report = patch(model)
    notes = {e.note for e in report.entries if e.module.endswith("self_attn")}
    assert notes == {"q_norm and k_norm in one launch; RoPE by transformers: "
                     "Qwen3RotaryEmbedding's frequencies are torch.bfloat16, rounded by a cast "
                     "of the model (load it in its dtype instead)"}
    torch.testing.assert_close(logits(model), expected, **TOLERANCE[torch.bfloat16])


def test_an_attention_called_without_position_ids_is_an_error():
    """The fused rotation reads the positions transformers' decoder layers pass: an attention
    called without them says so, rather than rotating by anything else."""
    model = build("qwen3", torch.float32)
    patch(model)
    x = torch.randn(1, 3, COMMON["hidden_size"])
    position_embeddings = model.model.rotary_emb(x, torch.arange(3)[None])
    with torch.no_grad(), pytest.raises(ValueError, match="reads the position_ids that "
                                                          "transformers' decoder layers pass"):
        model.model.layers[0].self_attn(x, position_embeddings=position_embeddings,
                                        attention_mask=None)
