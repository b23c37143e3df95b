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
    assert {"RMSNormProblem", "QKNormProblem", "SiluAndMulProblem", "MoEProblem"} <= used
    assert all(table.warmed_up for table in served.tables()), served.report()


def _tiny(family: str):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed here; the stand-in test covers "
                               "Qwen3-MoE without it")
    if not follows(transformers.__version__):
        pytest.skip(f"transformers {transformers.__version__} is installed here; the forwards "
                    f"follow {TRANSFORMERS_VERSIONS}, and the stand-in test covers Qwen3-MoE")
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if family == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    if family == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128))
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**common,
                                                                        sliding_window=16))


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "gemma3"])
def test_tiny_transformers_models_patched_on_the_gpu(family, fresh_dispatcher):
    torch.manual_seed(0)
    model = _tiny(family).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = _ids(33, 3)
    with torch.no_grad(), routing_pinned(model):
        expected = model(ids, use_cache=False).logits
        report = patch(model)
        assert report.left_alone == (), str(report)
        torch.testing.assert_close(model(ids, use_cache=False).logits, expected, **BF16)
    assert all(table.warmed_up for table in cutetune.current_dispatcher().tables())
