"""cutetune.integrations.transformers' version policy: a release in the tested range patches
quietly, a newer one patches after one warning, an older one is refused in one line; a module
without an attribute its forward reads is refused at patch time, by name, with nothing changed;
pyproject.toml's `hf` extra pins the range the code names."""

from __future__ import annotations

import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cutetune.integrations import hf_forwards  # noqa: E402
from cutetune.integrations import transformers as integration  # noqa: E402
from cutetune.integrations.transformers import (  # noqa: E402
    NotPatchableError,
    UntestedTransformersWarning,
    patch,
    unpatch,
)
from testkit.tiny_hf_models import TOLERANCE, build, logits  # noqa: E402

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


@pytest.fixture
def release(monkeypatch):
    """Sets the version patch reads (transformers replaces its sys.modules entry as it loads,
    so the entry is the package patch imports), with no release warned about yet."""
    monkeypatch.setattr(integration, "_warned", set())

    def set_version(version: str) -> None:
        monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    return set_version


def untouched(model: torch.nn.Module) -> dict:
    """What patch would change: the bound forwards, the buffers, where each parameter's data
    lies (the gated MLPs' weights become views of a fused buffer), the report."""
    return {"forwards": [name for name, m in model.named_modules() if "forward" in vars(m)],
            "buffers": sorted(name for name, _ in model.named_buffers()),
            "data": {name: p.data_ptr() for name, p in model.named_parameters()},
            "report": integration.patch_report(model)}


def test_the_tested_range_is_5_17_to_5_25():
    assert integration.TRANSFORMERS_VERSIONS == "5.17 to 5.25"
    assert all(map(integration.follows, ["5.17.0", "5.20.2", "5.25.0", "5.25.1.dev0"]))
    assert not any(map(integration.follows, ["5.16.1", "5.26.0", "4.57.6", "15.17.0", "dev"]))


@pytest.mark.parametrize("version", ["4.57.1", "5.16.1", "dev"])
def test_a_release_older_than_the_range_is_one_line_and_nothing_changes(version, release):
    model = build("llama", torch.float32)
    before = untouched(model)
    release(version)
    with pytest.raises(NotPatchableError) as raised:
        patch(model)
    assert str(raised.value) == (
        f"cutetune patches models of transformers 5.17 and newer (tested with 5.17 to 5.25); "
        f"this is transformers {version}: upgrade it, e.g. pip install 'cutetune[hf]'")
    assert untouched(model) == before


@pytest.mark.parametrize("version", ["5.17.0", "5.25.0"])
def test_a_release_in_the_range_patches_without_a_warning(version, release):
    release(version)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedTransformersWarning)
        assert patch(build("llama", torch.float32)).replaced


@pytest.mark.parametrize("version", ["5.26.0", "6.0.0"])
def test_a_release_newer_than_the_range_warns_once_and_patches(version, release):
    model = build("qwen3", torch.bfloat16)
    expected = logits(model)
    release(version)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # so that only patch's own memory stops a repeat
        report = patch(model)
        unpatch(model)
        patch(model)
        patch(build("llama", torch.float32))
    untested = [w for w in caught if w.category is UntestedTransformersWarning]
    assert [str(w.message) for w in untested] == [
        f"transformers {version} is newer than the releases cutetune's forwards are tested with "
        f"(5.17 to 5.25): patching anyway; compare the patched model's outputs with the "
        f"unpatched model's, or pip install 'cutetune[hf]'"]
    assert untested[0].filename == __file__  # it points at the caller of patch
    assert report.replaced and not report.left_alone
    torch.testing.assert_close(logits(model), expected, **TOLERANCE[torch.bfloat16])


# (family, the module whose attribute goes, the attribute, the module patch names, its class,
# what it lacks). Layer 1's go where layer 0 has been planned first: a refusal part-way through
# the model still changes nothing.
MISSING = [
    ("llama", "model.layers.1", "mlp", "model.layers.1", "LlamaDecoderLayer", "mlp"),
    ("llama", "model.layers.0.mlp", "down_proj", "model.layers.0.mlp", "LlamaMLP", "down_proj"),
    ("llama", "model.norm", "variance_epsilon", "model.norm", "LlamaRMSNorm",
     "'variance_epsilon' or 'eps'"),
    ("llama", "model.norm", "weight", "model.norm", "LlamaRMSNorm", "weight"),
    ("llama", "model.layers.0.self_attn", "o_proj", "model.layers.0.self_attn",
     "LlamaAttention", "o_proj"),
    ("qwen3", "model.layers.1.self_attn", "o_proj", "model.layers.1.self_attn",
     "Qwen3Attention", "o_proj"),
    ("qwen3", "model.layers.0.self_attn", "scaling", "model.layers.0.self_attn",
     "Qwen3Attention", "scaling"),
    ("qwen3_moe", "model.layers.1.mlp.experts", "gate_up_proj", "model.layers.1.mlp",
     "Qwen3MoeSparseMoeBlock", "experts.gate_up_proj"),
    ("qwen3_moe", "model.layers.0.mlp.gate", "top_k", "model.layers.0.mlp",
     "Qwen3MoeSparseMoeBlock", "gate.top_k"),
    ("gemma3", "model.layers.1", "post_feedforward_layernorm", "model.layers.1",
     "Gemma3DecoderLayer", "post_feedforward_layernorm"),
    ("gemma3", "model.layers.0.pre_feedforward_layernorm", "eps",
     "model.layers.0.pre_feedforward_layernorm", "Gemma3RMSNorm", "'variance_epsilon' or 'eps'"),
]


@pytest.mark.parametrize("family, owner, attribute, name, cls, lacks", MISSING,
                         ids=[f"{row[0]}-{row[1]}.{row[2]}" for row in MISSING])
def test_a_module_without_an_attribute_its_forward_reads_is_refused_by_name(
        family, owner, attribute, name, cls, lacks):
    model = build(family, torch.bfloat16)
    delattr(model.get_submodule(owner), attribute)
    before = untouched(model)
    with pytest.raises(NotPatchableError) as raised:
        patch(model)
    what = lacks if lacks.startswith("'") else repr(lacks)
    assert str(raised.value) == (
        f"cutetune cannot patch {name} ({cls}): it has no attribute {what}, which cutetune reads "
        f"(transformers {transformers.__version__}; the forwards follow 5.17 to 5.25)")
    assert untouched(model) == before


def test_a_modeling_module_without_a_function_the_attention_calls_is_refused_by_name(
        monkeypatch):
    model = build("qwen3", torch.bfloat16)
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    monkeypatch.delattr(modeling, "apply_rotary_pos_emb")
    before = untouched(model)
    with pytest.raises(NotPatchableError, match=(
            r"cannot patch model\.layers\.0\.self_attn \(Qwen3Attention\): it has no "
            r"'apply_rotary_pos_emb' in its modeling module "
            r"transformers\.models\.qwen3\.modeling_qwen3, which cutetune reads")):
        patch(model)
    assert untouched(model) == before


def test_every_forward_declares_what_it_reads():
    forwards = [getattr(hf_forwards, name) for name in dir(hf_forwards)
                if name.endswith("_forward")]
    assert len(forwards) == 6
    assert all(forward.reads for forward in forwards)


def test_the_hf_extra_pins_the_tested_range_and_the_test_extra_uses_it():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (first_major, first_minor), (last_major, last_minor) = integration.FOLLOWED_RELEASES
    assert extras["hf"] == [
        f"transformers>={first_major}.{first_minor},<{last_major}.{last_minor + 1}"]
    # CI installs .[test]: through the hf extra it gets the newest release of the range.
    assert "cutetune[hf]" in extras["test"]
    assert not any(r.startswith("transformers") for r in extras["test"])


def test_the_tests_pass_the_kv_cache_by_the_name_the_release_takes():
    """transformers 5.24 renamed the forward's `past_key_values` to `cache`; a model of an
    earlier release (5.17 on the GPU machine) takes the other name into its kwargs unused and
    runs without the cache, so the tests name it as the model's forward does."""
    from testkit.tiny_hf_models import kv_cache_argument

    class Before(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            return past_key_values

    class After(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, **kwargs):
            return cache

    cache = object()
    for model in (Before(), After()):
        assert model(**kv_cache_argument(model, cache)) is cache
