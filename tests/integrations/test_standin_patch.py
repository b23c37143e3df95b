"""The plain-torch Qwen3-MoE stand-in (testkit/qwen3_moe_standin.py) that the GPU tests patch
where transformers is not installed: checked here, on the CPU and against the stub of
transformers, to compute what transformers' Qwen3-MoE computes and to be patched whole."""

from __future__ import annotations

import sys

import pytest
import torch

from cutetune.integrations.transformers import TRANSFORMERS_VERSIONS, follows, patch, unpatch
from testkit.qwen3_moe_standin import VOCAB, build_standin, routing_pinned, transformers_stub


def test_the_standin_is_transformers_qwen3_moe():
    transformers = pytest.importorskip("transformers")
    if not follows(transformers.__version__):
        pytest.skip(f"transformers {transformers.__version__} is installed here; the stand-in "
                    f"follows {TRANSFORMERS_VERSIONS}")
    standin = build_standin(torch.float32, "cpu")
    fields = standin.config.to_dict()
    config = transformers.Qwen3MoeConfig(**fields, attn_implementation="eager")
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(
        {(k if k.startswith("lm_head.") else "model." + k): v
         for k, v in standin.state_dict().items()}, strict=False)
    assert unexpected == [] and missing == []
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(standin(ids), model(ids, use_cache=False).logits,
                                   rtol=1e-5, atol=1e-5)


def test_the_standin_is_patched_whole_with_the_transformers_stub(monkeypatch):
    for name, module in transformers_stub().items():
        monkeypatch.setitem(sys.modules, name, module)
    model = build_standin(torch.bfloat16, "cpu")
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), routing_pinned(model):
        expected = model(ids)
        report = patch(model)
        got = model(ids)
        unpatch(model)
        again = model(ids)
    assert report.left_alone == ()
    assert {e.op for e in report.replaced} == {
        "rmsnorm", "fused_add_rmsnorm", "qk_norm_rope", "moe_dispatch, silu_and_mul, moe_combine"}
    assert got.shape == (1, 64, VOCAB)
    torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=3e-2)
    assert torch.equal(again, expected)


def test_pinned_routing_keeps_a_rounding_tie_from_sending_tokens_elsewhere(monkeypatch):
    """Unpinned, these 64 tokens of the stand-in meet router ties that the patched model's
    rounding breaks the other way (two tokens of its second layer go to other experts)."""
    for name, module in transformers_stub().items():
        monkeypatch.setitem(sys.modules, name, module)
    model = build_standin(torch.bfloat16, "cpu")
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        patch(model)
        unpinned = model(ids)
        unpatch(model)
    assert not torch.allclose(unpinned, expected, rtol=1.6e-2, atol=3e-2)
