"""The Hugging Face integration on the GPU: a patched model runs cutetune's kernels, warmed up
for its config, and its logits stay within bf16 tolerance of the unpatched model's, eagerly and
replayed from a CUDA graph. Where the installed transformers is not one of the releases the
forwards follow (TRANSFORMERS_VERSIONS), or there is none, the plain-torch Qwen3-MoE stand-in
(testkit/qwen3_moe_standin.py, checked against transformers on the CPU) is patched through a stub
of the package, and the tests of real transformers models skip with the reason."""

from __future__ import annotations

import pytest
import torch

import cutetune
from cutetune.integrations.transformers import TRANSFORMERS_VERSIONS, follows, patch, unpatch
from cutetune.serving.warmup import set_current
from testkit.qwen3_moe_standin import VOCAB, build_standin, routing_pinned, transformers_or_stub

pytestmark = pytest.mark.gpu

# bf16: the patched model rounds in other places than the unpatched one (a norm rounds once,
# not twice; the MoE combine sums the experts' outputs in fp32).
BF16 = dict(rtol=1.6e-2, atol=3e-2)


@pytest.fixture(scope="module")
def shared_cache_dir(tmp_path_factory):
    """One artifact cache for the module's warmups: the models share points (the stand-in's
    two token counts all of them), and an artifact is keyed by everything its binary depends
    on, so a point compiled by one warmup is loaded by the next."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def fresh_dispatcher(tmp_path, shared_cache_dir, monkeypatch):
    """Warmup reads and writes a database of this test's own (the module's artifact cache);
    the process-wide dispatcher it installs is dropped afterwards."""
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(shared_cache_dir))
    monkeypatch.setenv("CUTETUNE_DB", f"sqlite:///{tmp_path / 'cutetune.db'}")
    yield
    set_current(None)


def _ids(tokens: int, seed: int) -> torch.Tensor:
    generator = torch.Generator("cuda").manual_seed(seed)
    return torch.randint(0, VOCAB, (1, tokens), device="cuda", generator=generator)


@pytest.mark.parametrize("tokens", [1, 64])
def test_the_patched_standin_runs_warmed_up_kernels_eagerly_and_in_a_cuda_graph(
        tokens, monkeypatch, fresh_dispatcher):
    transformers_or_stub(monkeypatch)
    model = build_standin(torch.bfloat16, "cuda")
    ids = _ids(tokens, 1)
    with torch.no_grad():
        with routing_pinned(model):
            expected = model(ids)
            report = patch(model)
            assert report.left_alone == (), str(report)
            assert report.warmup == "kernels for qwen3-moe-standin (bfloat16) loaded and compiled"
            torch.testing.assert_close(model(ids), expected, **BF16)

        # Warm up on the capture stream (moe_dispatch keeps its scratch per stream), capture,
        # then replay on new tokens written into the captured input; the replay computes what
        # the patched model computes eagerly.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(ids)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = model(ids)
        new_ids = _ids(tokens, 2)
        ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, model(new_ids), **BF16)
        unpatch(model)
        assert torch.equal(model(_ids(tokens, 1)), expected)
    served = cutetune.current_dispatcher()
    used = {table.problem.__class__.__name__ for table in served.tables()}
    assert {"RMSNormProblem", "QKNormRopeProblem", "SiluAndMulProblem", "MoEProblem"} <= used
    assert all(table.warmed_up for table in served.tables()), served.report()


# Rope parameters other than the families' defaults: Llama 3's scaling (the benchmark's
# Llama-3.2-3B's), and Gemma 3 4B to 27B's, whose full-attention layers scale linearly.
LLAMA3 = dict(rope_type="llama3", factor=32.0, rope_theta=500000.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=8192)
GEMMA3_LINEAR = {"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                 "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6)}
# (family, rope_parameters or None, the ops of its attentions by layer)
CASES = {
    "llama": ("llama", None, ["rope", "rope"]),
    "llama-llama3": ("llama", LLAMA3, ["rope", "rope"]),
    "qwen3": ("qwen3", None, ["qk_norm_rope", "qk_norm_rope"]),
    "qwen3_moe": ("qwen3_moe", None, ["qk_norm_rope", "qk_norm_rope"]),
    "gemma3": ("gemma3", None, ["qk_norm_rope", "qk_norm_rope"]),
    "gemma3-linear": ("gemma3", GEMMA3_LINEAR, ["qk_norm_rope", "qk_norm_rope"]),
}


def _tiny(family: str, rope_parameters: dict | None = None, **overrides):
    """transformers' model of the family, tiny, built in bf16 on the GPU as from_pretrained
    builds it (the rotary module's frequencies fp32), of the config fields `overrides` too.
    Gemma 3: a sliding-window layer, then a full-attention one."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed here; the stand-in test covers "
                               "Qwen3-MoE without it")
    if not follows(transformers.__version__):
        pytest.skip(f"transformers {transformers.__version__} is installed here; the forwards "
                    f"follow {TRANSFORMERS_VERSIONS}, and the stand-in test covers Qwen3-MoE")
    fields = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128, **overrides)
    if rope_parameters is not None:
        fields["rope_parameters"] = rope_parameters
    if family == "llama":
        config = transformers.LlamaConfig(**fields)
    elif family == "qwen3":
        config = transformers.Qwen3Config(**fields)
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**fields, num_experts=8, num_experts_per_tok=2,
                                             moe_intermediate_size=128)
    else:
        config = transformers.Gemma3TextConfig(
            **fields, sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.to("cuda").eval()


def _batch(batch: int, tokens: int, seed: int) -> torch.Tensor:
    generator = torch.Generator("cuda").manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, tokens), device="cuda", generator=generator)


def _steps(model, routing: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of a prefill of 33 tokens of two sequences into transformers' KV cache, the
    second 1000 positions on (as left padding, or a long context, sets them), then of one
    decode step, the second's 50 positions past its prefill's end (RoPE turns a shift common
    to a row's queries and keys into nothing: the step's distance from its row's keys shows
    the row's own positions): each forward's MoE routing pinned to `routing`'s record of it
    (filled by the first model that runs them)."""
    import transformers

    from testkit.tiny_hf_models import kv_cache_argument

    cache = transformers.DynamicCache(config=model.config)
    logits = []
    for i, (ids, positions) in enumerate((
            (_batch(2, 33, 4), torch.arange(33, device="cuda")[None]
             + torch.tensor([[0], [1000]], device="cuda")),
            (_batch(2, 1, 5), torch.tensor([[33], [1083]], device="cuda")))):
        with routing_pinned(model, routing[i]):
            logits.append(model(ids, position_ids=positions,
                                **kv_cache_argument(model, cache), use_cache=True).logits)
    return tuple(logits)


def _graph_replay(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of `model(ids)` captured in a CUDA graph and replayed on new tokens written
    into the captured input, and the eager forward's of those tokens (warm-up calls on the
    capture stream first: moe_dispatch keeps its scratch per stream)."""
    forward = lambda: model(ids, use_cache=False).logits  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = forward()
    new_ids = _batch(*ids.shape, seed=7)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    return captured, model(new_ids, use_cache=False).logits


@pytest.mark.parametrize("case", CASES)
def test_tiny_transformers_models_patched_on_the_gpu(case, fresh_dispatcher):
    """Every family's attention rotates with the fused op on the GPU (Gemma 3's linearly
    scaled layers too): a prefill, a decode step
    at positions past it (one sequence 1000 positions on) and a CUDA graph's replay of a
    batch-8 decode step stay within bf16 tolerance of the unpatched model's logits."""
    family, rope_parameters, attention_ops = CASES[case]
    model = _tiny(family, rope_parameters)
    ids = _batch(1, 33, 3)
    routing = [{}, {}, {}]
    with torch.no_grad():
        with routing_pinned(model, routing[2]):
            expected = model(ids, use_cache=False).logits
        expected_steps = _steps(model, routing)
        report = patch(model)
        assert report.left_alone == (), str(report)
        assert [e.op for e in report.entries if e.module.endswith("self_attn")] == attention_ops
        with routing_pinned(model, routing[2]):
            torch.testing.assert_close(model(ids, use_cache=False).logits, expected, **BF16)
        for got, want in zip(_steps(model, routing), expected_steps, strict=True):
            torch.testing.assert_close(got, want, **BF16)
        captured, eager = _graph_replay(model, _batch(8, 1, 6))
        torch.testing.assert_close(captured, eager, **BF16)
    # The warmup serves every problem the forwards call: Gemma 3's two kinds of layer each
    # their own rotation's (spaces/hf_config.py reads one per kind).
    tables = cutetune.current_dispatcher().tables()
    assert all(table.warmed_up for table in tables), cutetune.current_dispatcher().report()


@pytest.mark.parametrize("case", ["llama", "gemma3-linear"])
def test_the_cos_sin_cache_grows_eagerly_then_a_cuda_graph_replays_past_the_context(
        case, fresh_dispatcher):
    """A model of max_position_embeddings 64 decodes past it: the prefill of 60 tokens and 10
    decode steps (each step's token given, so that the two models' steps stay alike) match
    the unpatched model's logits, the cos/sin caches grown (to 128 rows: twice theirs) before
    the kernels read past their rows; then a forward of 200 tokens grows them again (to 256),
    eagerly, on the capture stream's warm-up call, and its CUDA graph, captured without
    growing, replays what the eager forward computes, which is the unpatched model's."""
    family, rope_parameters, _ = CASES[case]
    model = _tiny(family, rope_parameters, max_position_embeddings=64)
    import transformers

    from testkit.tiny_hf_models import kv_cache_argument

    ids = _batch(2, 70, 9)

    def steps() -> list[torch.Tensor]:
        cache = transformers.DynamicCache(config=model.config)
        chunks = [ids[:, :60], *ids[:, 60:].split(1, dim=1)]
        return [model(chunk, **kv_cache_argument(model, cache), use_cache=True).logits
                for chunk in chunks]

    def rows() -> set[int]:
        return {buffer.shape[0] for name, buffer in model.model.rotary_emb.named_buffers()
                if name.startswith("cutetune_cos_sin_cache")}

    with torch.no_grad():
        expected = steps()
        # _graph_replay's eager forward runs on these tokens (its seed 7).
        expected_long = model(_batch(2, 200, 7), use_cache=False).logits
        patch(model)
        assert rows() == {64}
        for got, want in zip(steps(), expected, strict=True):
            torch.testing.assert_close(got, want, **BF16)
        assert rows() == {128}
        captured, eager = _graph_replay(model, _batch(2, 200, 6))
        assert rows() == {256}
        torch.testing.assert_close(captured, eager, **BF16)
        torch.testing.assert_close(eager, expected_long, **BF16)
