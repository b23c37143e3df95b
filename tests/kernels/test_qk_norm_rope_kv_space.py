"""qk_norm_rope_kv's Problem, cost, reference, inputs, check and model problems (no compiling):
qk_norm_rope's, and the paged KV cache write."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import qk_norm_rope
from cutetune.kernels.qk_norm_rope import QKNormRopeConfig
from cutetune.kernels.qk_norm_rope_kv import (
    FP8,
    KERNEL,
    SPACE,
    QKNormRopeKVProblem,
    check,
    cost,
    default_config,
    make_inputs,
    problems_for_model,
    reference,
)
from cutetune.kernels.registry import NotApplicableError, VerificationError, get_kernel
from cutetune.kernels.rope import CACHE, NEOX
from cutetune.spaces.models import PRESETS, load_model

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"

H200 = DEVICE_SPECS["H200"]


def problem(**overrides) -> QKNormRopeKVProblem:
    values = dict(num_tokens=37, dtype="bfloat16", head_dim=128, rotary_dim=128, q_heads=4,
                  kv_heads=2, style=NEOX, positions_dtype="int64", cache_dtype="bfloat16",
                  theta=1e6, eps=1e-6, weight_bias=0.0, kv_cache_dtype="bfloat16",
                  block_size=16)
    values.update(overrides)
    return QKNormRopeKVProblem(**values)


def test_registered_under_its_name_with_qk_norm_rope_s_knobs_and_constraints():
    assert get_kernel("qk_norm_rope_kv") is KERNEL
    assert KERNEL.space is SPACE and SPACE.params == qk_norm_rope.SPACE.params
    assert ({c.name for c in SPACE.constraints}
            == {c.name for c in qk_norm_rope.SPACE.constraints})


def test_the_register_limits_count_v_s_share():
    # Gemma 3's head of 256 over 8 threads: 64 values of the head and its cos and sin fit a
    # thread of qk_norm_rope; with v's 32 they do not.
    gemma = problem(head_dim=256, rotary_dim=256)
    config = QKNormRopeConfig(CACHE, 128, 4, 1)
    assert qk_norm_rope.SPACE.first_violation(gemma.fused, config, H200) is None
    assert SPACE.first_violation(gemma, config, H200).name == "thread_fits_registers"
    chosen = default_config(gemma, H200)
    assert SPACE.first_violation(gemma, chosen, H200) is None
    assert cost(gemma, chosen, H200).registers_per_thread == (
        qk_norm_rope.cost(gemma.fused, chosen, H200).registers_per_thread
        + 256 // (32 // chosen.heads_per_warp))


@pytest.mark.parametrize(("fields", "message"), [
    (dict(kv_cache_dtype="float16"), "kv_cache_dtype 'float16' must be float8_e4m3fn or the "
                                     "dtype of q and k (bfloat16)"),
    (dict(block_size=0), "block_size must be a positive integer, got 0"),
    (dict(eps=0.0), "eps must be positive"),  # qk_norm_rope's own checks still run
])
def test_problem_validation(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        problem(**fields)


def test_the_fused_part_is_qk_norm_rope_s_problem():
    kv = problem(kv_cache_dtype=FP8, block_size=32)
    assert kv.fused == qk_norm_rope.QKNormRopeProblem(
        **{name: getattr(kv, name) for name in qk_norm_rope.QKNormRopeProblem.static_names()},
        num_tokens=37)
    assert kv.static_tuple()[-2:] == (FP8, 32)


@pytest.mark.parametrize("cache", ("bfloat16", FP8))
def test_cost_adds_v_s_read_the_cache_writes_and_the_slots(cache):
    kv = problem(num_tokens=64, kv_cache_dtype=cache)
    config = default_config(kv, H200)
    fused, ours = qk_norm_rope.cost(kv.fused, config, H200), cost(kv, config, H200)
    elements = 64 * 2 * 128
    assert ours.bytes_moved - fused.bytes_moved == (
        elements * 2 + 2 * elements * (1 if cache == FP8 else 2) + 64 * 8)
    assert (ours.flops, ours.blocks) == (fused.flops, fused.blocks)


@pytest.mark.parametrize("cache", ("bfloat16", FP8))
def test_reference_writes_k_and_v_at_their_slots_and_nothing_else(cache):
    kv = problem(kv_cache_dtype=cache)
    tensors = make_inputs(kv, "cpu", torch.Generator().manual_seed(3))
    slots = tensors["slot_mapping"]
    written = slots >= 0
    assert 0 < int(written.sum()) < kv.num_tokens  # some tokens are padding
    assert len(set(slots[written].tolist())) == int(written.sum())  # distinct slots
    expected = reference(tensors, kv)
    fused = qk_norm_rope.reference(tensors, kv.fused)
    torch.testing.assert_close(expected["k"], fused["k"])
    k_scale, v_scale = (float(tensors[n]) if cache == FP8 else 1.0 for n in ("k_scale",
                                                                              "v_scale"))
    for name, rows, scale in (("key_cache", fused["k"].bfloat16().float(), k_scale),
                              ("value_cache", tensors["v"].float(), v_scale)):
        flat = expected[name].view(-1, kv.kv_heads, kv.head_dim)
        torch.testing.assert_close(flat[slots[written]], rows[written] / scale)
        untouched = torch.ones(flat.shape[0], dtype=torch.bool)
        untouched[slots[written]] = False
        before = tensors[name].float().view(-1, kv.kv_heads, kv.head_dim)
        assert torch.equal(flat[untouched], before[untouched])
        assert (before[untouched] >= 96).all()  # far from any k or v
    # v is the third view of the one fused qkv buffer.
    assert tensors["v"].data_ptr() == tensors["k"].data_ptr() + 2 * 128 * 2


def test_fp8_inputs_do_not_saturate():
    kv = problem(num_tokens=4096, kv_cache_dtype=FP8)
    tensors = make_inputs(kv, "cpu", torch.Generator().manual_seed(0))
    expected = reference(tensors, kv)
    written = tensors["slot_mapping"] >= 0
    for name in ("key_cache", "value_cache"):
        rows = expected[name].view(-1, 2, 128)[tensors["slot_mapping"][written]]
        assert rows.abs().max() < 448 / 2


@pytest.mark.parametrize("cache", ("bfloat16", FP8))
def test_check_passes_the_reference_written_as_the_op_writes_it_and_fails_a_stray_slot(cache):
    kv = problem(kv_cache_dtype=cache)
    tensors = make_inputs(kv, "cpu", torch.Generator().manual_seed(1))
    expected = reference(tensors, kv)
    for name in KERNEL.outputs:
        tensors[name].copy_(expected[name])  # the CPU path: torch converts to FP8
    check(tensors, expected, kv)
    stray = int(torch.nonzero(tensors["slot_mapping"] < 0)[0])
    flat = tensors["key_cache"].view(-1, 2, 128)
    unused = next(s for s in range(flat.shape[0]) if s not in tensors["slot_mapping"].tolist())
    flat[unused] = tensors["k"][stray]
    with pytest.raises(VerificationError, match="key_cache"):
        check(tensors, expected, kv)


def test_model_problems_are_qk_norm_rope_s_with_each_cache():
    model = PRESETS["qwen3-8b"]
    problems = problems_for_model(model, "bfloat16")
    (fused,) = qk_norm_rope.problems_for_model(model, "bfloat16")
    assert [(p.kv_cache_dtype, p.block_size) for p in problems] == [("bfloat16", 16), (FP8, 16)]
    assert all(p.fused == fused for p in problems)
    assert default_config(problems[1], H200).cos_sin == CACHE


def test_gemma_3_27b_has_each_rotation_with_each_cache():
    # Its sliding-window layers' theta 1e4 and its full-attention layers' 1e6 scaled linearly.
    model = load_model(str(HF_CONFIGS / "gemma-3-27b-it.json"))
    fused = qk_norm_rope.problems_for_model(model, "bfloat16")
    assert [(p.theta, p.scaling) for p in fused] == [(1e4, "default"), (1e6, "linear")]
    assert [(p.fused, p.kv_cache_dtype) for p in problems_for_model(model, "bfloat16")] == [
        (f, cache) for f in fused for cache in ("bfloat16", FP8)]


@pytest.mark.parametrize("stated, caches", [("float8_e4m3fn", [FP8]), ("bfloat16", ["bfloat16"])])
def test_a_checkpoint_s_kv_cache_dtype_is_the_only_cache(stated, caches):
    model = dataclasses.replace(PRESETS["qwen3-8b"], kv_cache_dtype=stated)
    assert [p.kv_cache_dtype for p in problems_for_model(model, "bfloat16")] == caches


def test_a_kv_cache_this_kernel_does_not_write_is_not_applicable():
    model = dataclasses.replace(PRESETS["qwen3-8b"], kv_cache_dtype="nvfp4")
    with pytest.raises(NotApplicableError, match="model qwen3-8b states a nvfp4 KV cache; "
                       "qk_norm_rope_kv writes bfloat16 or float8_e4m3fn"):
        problems_for_model(model, "bfloat16")
