"""qk_norm's Problem, Config space, seed heuristic, cost and model problems (no compiling)."""

import dataclasses
import math

import pytest

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.qk_norm import (
    KERNEL,
    SPACE,
    QKNormConfig,
    QKNormProblem,
    cost,
    default_config,
    problems_for_model,
)
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.spaces.models import PRESETS, ModelShape

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
QWEN3 = [name for name in PRESETS if name.startswith("qwen3")]


def problem(**overrides) -> QKNormProblem:
    values = dict(num_tokens=1, dtype="bfloat16", head_dim=128, q_heads=32, kv_heads=8,
                  eps=1e-6, weight_bias=0.0)
    values.update(overrides)
    return QKNormProblem(**values)


def test_registered_under_its_name():
    assert get_kernel("qk_norm") is KERNEL
    assert KERNEL.space is SPACE
    assert KERNEL.problem_type is QKNormProblem


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "int8", "dtype 'int8' not supported"),
    ("dtype", "float64", "dtype 'float64' not supported"),
    ("head_dim", 96, "head_dim 96 not supported"),
    ("weight_bias", 0.5, "weight_bias must be 0 or 1"),
    ("eps", 0.0, "eps must be positive"),
    ("eps", -1e-6, "eps must be positive"),
    ("num_tokens", 0, "num_tokens must be a positive integer"),
    ("q_heads", 0, "head counts must be positive"),
    ("kv_heads", -1, "head counts must be positive"),
])
def test_problem_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        problem(**{field: value})


def test_problem_key_is_static_part_only():
    a, b = problem(num_tokens=1), problem(num_tokens=4096)
    assert a.static_key() == b.static_key()
    assert a.static_tuple() == ("bfloat16", 128, 32, 8, 1e-6, 0.0)
    assert a.static_key() != problem(weight_bias=1.0).static_key()


@pytest.mark.parametrize("name", QWEN3)
@pytest.mark.parametrize("dtype", DTYPES)
def test_problems_for_qwen3_presets(name, dtype):
    model = PRESETS[name]
    (p,) = problems_for_model(model, dtype)
    assert p == QKNormProblem(num_tokens=1, dtype=dtype, head_dim=128,
                              q_heads=model.num_q_heads, kv_heads=model.num_kv_heads,
                              eps=1e-6, weight_bias=0.0)


def test_qwen3_presets_are_all_present():
    assert sorted(QWEN3) == sorted(["qwen3-0.6b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b",
                                    "qwen3-235b-a22b"])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3",
                                  "mixtral-8x7b"])
def test_not_applicable_without_qk_norm(name):
    with pytest.raises(NotApplicableError, match=f"model {name} does not normalise q and k"):
        problems_for_model(PRESETS[name], "bfloat16")


def test_not_applicable_for_unsupported_head_dim():
    model = ModelShape("odd", 2560, 32, 8, 80, 1e-6, True)
    with pytest.raises(NotApplicableError, match="head_dim 80"):
        problems_for_model(model, "bfloat16")


TOKENS = (1, 2, 6, 7, 64, 512, 4096, 2**20)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_default_config_is_a_valid_point(dtype, head_dim):
    for tokens in TOKENS:
        p = problem(dtype=dtype, head_dim=head_dim, num_tokens=tokens)
        config = default_config(p, H200)
        SPACE.check(p, config, H200)  # raises if not a valid point
        assert config in SPACE.enumerate(p, H200).valid
        assert config.vector_bits == 128
        # The fewest threads per head that still give every thread whole 128-bit vectors.
        vector = 128 // (8 * ELEMENT_BYTES[dtype])
        assert 32 // config.heads_per_warp == min(32, head_dim // vector)


def test_cost_by_hand():
    # Qwen3-8B bf16, 3 tokens: 3 * (32 + 8) * 128 = 15360 elements of 2 bytes, read and
    # written, plus two 128-element weight vectors: 2 * 15360 * 2 + 2 * 128 * 2 = 61952 bytes.
    p = problem(num_tokens=3)
    c = cost(p, QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=4), H200)
    assert c.bytes_moved == 2 * 3 * (32 + 8) * 128 * 2 + 2 * 128 * 2 == 61952
    assert c.flops == 4 * 15360
    # 8 heads per block: ceil(96 / 8) q blocks + ceil(24 / 8) k blocks.
    assert c.blocks == 12 + 3
    assert c.threads_per_block == 128
    # 16 threads per head -> 8 elements per thread (16 bytes) loaded before the reduction,
    # held in fp32 registers until the store.
    assert c.bytes_in_flight_per_thread == 16
    assert c.registers_per_thread > 8
    assert (c.launches, c.grid_barriers, c.smem_per_block) == (1, 0, 0)


def test_cost_blocks_round_q_and_k_separately():
    # 1 token, 32 heads per block: q needs 1 block, k (8 heads) needs another.
    c = cost(problem(), QKNormConfig(vector_bits=32, heads_per_warp=32, warps_per_block=1), H200)
    assert c.blocks == 2
    c = cost(problem(num_tokens=5, dtype="float32"),
             QKNormConfig(vector_bits=128, heads_per_warp=1, warps_per_block=16), H200)
    assert c.blocks == math.ceil(160 / 16) + math.ceil(40 / 16) == 13
    assert c.bytes_moved == 2 * 5 * 40 * 128 * 4 + 2 * 128 * 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_every_valid_point_gives_threads_whole_vectors(dtype, head_dim):
    p = problem(dtype=dtype, head_dim=head_dim)
    enumeration = SPACE.enumerate(p, H200)
    assert enumeration.declared == 90
    assert enumeration.valid
    vector_elements = {}
    for config in enumeration.valid:
        vector = config.vector_bits // (8 * ELEMENT_BYTES[dtype])
        per_thread = head_dim // (32 // config.heads_per_warp)
        assert vector >= 1
        assert per_thread >= vector and per_thread % vector == 0, config
        assert per_thread <= 64, config
        assert config.warps_per_block * 32 <= H200.max_threads_per_block
        vector_elements[config.vector_bits] = vector
    # Every vector width stays available at every head dim and dtype.
    assert set(vector_elements) == {32, 64, 128}
    for rejection in enumeration.rejected:
        assert rejection.constraint in {c.name for c in SPACE.constraints}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_every_valid_point_is_resident_on_every_device(dtype, head_dim):
    # The register constraint must agree with the roofline's residency model, or ranking a
    # valid point would raise.
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            p = problem(dtype=dtype, head_dim=head_dim, num_tokens=tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


def test_rejections_for_a_small_head():
    # bf16 head dim 64: a 128-bit vector holds 8 elements, so a thread needs at least 8 of
    # the head's 64, i.e. at most 8 threads per head (4 or more heads per warp); a 64-bit
    # vector (4 elements) cannot be split over 32 threads (2 elements each) either.
    enumeration = SPACE.enumerate(problem(head_dim=64), H200)
    bad = {r.config for r in enumeration.rejected
           if r.constraint == "head_splits_into_whole_vectors"}
    assert QKNormConfig(128, 1, 1) in bad and QKNormConfig(128, 2, 1) in bad
    assert QKNormConfig(128, 4, 1) in enumeration.valid
    assert QKNormConfig(64, 1, 1) in bad  # 2 elements per thread, 4 per 64-bit vector
    assert QKNormConfig(32, 1, 1) in enumeration.valid


def test_gemma_style_model_gets_weight_bias_one():
    gemma = dataclasses.replace(PRESETS["qwen3-8b"], name="gemma-like", norm_weight_bias=1.0)
    (problem,) = KERNEL.problems_for_model(gemma, "bfloat16")
    assert problem.weight_bias == 1.0


def test_points_with_more_than_16_vectors_per_thread_are_rejected_by_name():
    problem = QKNormProblem(num_tokens=1, dtype="float32", head_dim=256, q_heads=8, kv_heads=2,
                            eps=1e-6, weight_bias=0.0)
    # 32-bit fp32 vectors and 8 threads per head: 32 elements, one per access.
    config = QKNormConfig(vector_bits=32, heads_per_warp=4, warps_per_block=1)
    rejected = {r.config: r.constraint for r in KERNEL.space.enumerate(problem, H200).rejected}
    assert rejected[config] == "vectors_per_thread_unrollable"
