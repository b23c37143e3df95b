"""Multimodal RoPE (mrope) in the rope kernel's declaration: the problems Qwen3-VL's config
gives, each pair's position stream checked against transformers' own rotary embeddings of
Qwen2-VL (runs of pairs per stream) and Qwen3-VL (interleaved), and the problem's one-line
refusals."""

import json
from pathlib import Path

import pytest
import torch
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig, Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.rope import (
    KERNEL,
    MROPE_INTERLEAVED,
    MROPE_NONE,
    MROPE_SECTIONS,
    NEOX,
    YARN,
    RopeProblem,
    problems_for_model,
    reference,
)
from cutetune.kernels.rope_frequencies import mrope_stream, problem_cos_sin
from cutetune.spaces.models import load_model

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
H200 = DEVICE_SPECS["H200"]


def problem(mrope=MROPE_INTERLEAVED, sections=(24, 20, 20), theta=5e6, **fields):
    t, h, w = sections
    return RopeProblem(num_tokens=5, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=8,
                       kv_heads=2, style=NEOX, positions_dtype="int64", cache_dtype="bfloat16",
                       theta=theta, mrope=mrope, mrope_t=t, mrope_h=h, mrope_w=w, **fields)


def test_qwen3_vl_config_gives_an_interleaved_mrope_problem():
    path = HF_CONFIGS / "Qwen3-VL-235B-A22B-Instruct.json"
    model = load_model(str(path))
    stated = Qwen3VLConfig.from_dict(json.loads(path.read_text())).text_config.rope_parameters
    assert model.mrope_section == tuple(stated["mrope_section"]) == (24, 20, 20)
    assert stated["mrope_interleaved"] is True
    (found,) = problems_for_model(model, "bfloat16")
    assert (found.mrope, found.mrope_t, found.mrope_h, found.mrope_w) == (
        MROPE_INTERLEAVED, 24, 20, 20)
    assert found.theta == 5e6 and found.position_streams == 3


@pytest.mark.parametrize(("rotary", "config", "mrope", "sections", "theta"), [
    (Qwen2VLRotaryEmbedding, Qwen2VLTextConfig, MROPE_SECTIONS, (16, 24, 24), 1e6),
    (Qwen3VLTextRotaryEmbedding, Qwen3VLTextConfig, MROPE_INTERLEAVED, (24, 20, 20), 5e6),
], ids=["qwen2-vl-sections", "qwen3-vl-interleaved"])
def test_each_pair_rotates_by_the_stream_transformers_gives_it(rotary, config, mrope, sections,
                                                               theta):
    parameters = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(sections)}
    if mrope == MROPE_INTERLEAVED:
        parameters["mrope_interleaved"] = True
    embedding = rotary(config(hidden_size=1024, num_attention_heads=8, head_dim=128,
                              rope_parameters=parameters))
    # Positions apart per stream (and small: transformers' angles are fp32).
    positions = torch.stack([torch.randperm(1000)[:7] + 1000 * s for s in range(3)])
    cos, sin = embedding(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    ours = problem_cos_sin(positions, problem(mrope, sections, theta))
    torch.testing.assert_close(ours[:, :64].float(), cos[0, :, :64], atol=2e-4, rtol=0)
    torch.testing.assert_close(ours[:, 64:].float(), sin[0, :, :64], atol=2e-4, rtol=0)


def test_the_streams_of_the_two_layouts():
    assert [mrope_stream(i, (MROPE_SECTIONS, 16, 24, 24)) for i in (0, 15, 16, 39, 40, 63)] == [
        0, 0, 1, 1, 2, 2]
    interleaved = (MROPE_INTERLEAVED, 24, 20, 20)
    assert [mrope_stream(i, interleaved) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # Past 3 h - 2 and 3 w - 1 the temporal stream takes every pair.
    assert [mrope_stream(i, interleaved) for i in (58, 59, 60, 61, 62, 63)] == [1, 2, 0, 0, 0, 0]


def test_three_equal_streams_rotate_as_one():
    single = RopeProblem(num_tokens=5, dtype="bfloat16", head_dim=128, rotary_dim=128,
                         q_heads=8, kv_heads=2, style=NEOX, positions_dtype="int64",
                         cache_dtype="bfloat16", theta=5e6)
    tensors = KERNEL.make_inputs(single, "cpu", torch.Generator().manual_seed(0))
    expected = reference(tensors, single)
    tensors["positions"] = tensors["positions"].expand(3, -1)
    for name, value in reference(tensors, problem()).items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0)


def test_make_inputs_draws_three_streams_and_fills_their_cache_rows():
    p = problem()
    tensors = KERNEL.make_inputs(p, "cpu", torch.Generator().manual_seed(0))
    assert tensors["positions"].shape == (3, 5)
    assert not tensors["cos_sin_cache"][tensors["positions"].flatten()].isnan().any()


def test_mrope_reads_three_positions_and_three_cache_rows_a_token():
    p = problem().with_tokens(4096)
    flat = RopeProblem(**{**vars(p), "mrope": MROPE_NONE, "mrope_t": 0, "mrope_h": 0,
                          "mrope_w": 0})
    config = KERNEL.default_config(p, H200)
    extra = KERNEL.cost(p, config, H200).bytes_moved - KERNEL.cost(flat, config, H200).bytes_moved
    assert extra == 4096 * 2 * (8 + 128 * 2)  # two more int64 positions and cache rows


@pytest.mark.parametrize(("fields", "message"), [
    (dict(sections=(24, 20, 19)), "sum to rotary_dim / 2 = 64"),
    (dict(sections=(-1, 33, 32), mrope=MROPE_SECTIONS), "at least 0 each"),
    (dict(sections=(0, 22, 42)), "run past the 64 rotated pairs"),
    (dict(mrope="spiral"), "mrope 'spiral' not supported"),
    (dict(mrope=MROPE_NONE), "given without mrope"),
    (dict(scaling=YARN, scaling_factor=4.0, original_max_position=32768),
     "mrope with the yarn scaling is not supported"),
])
def test_bad_mrope_fields_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message):
        problem(**fields)
