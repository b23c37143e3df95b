"""moe_combine: the Config space and its named constraints, the seed heuristic, cost and the
model problems (no compiling)."""

import dataclasses
import math

import pytest

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels import moe_common
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.moe_combine import (
    KERNEL,
    MAX_TOP_K,
    SPACE,
    CombineConfig,
    cost,
    default_config,
    vector_bits,
)
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.registry import NotApplicableError, PeerUnavailable, get_kernel
from cutetune.spaces.models import PRESETS
from cutetune.spaces.space import EmptySpaceError

H200 = DEVICE_SPECS["H200"]
TOKENS = (1, 2, 7, 64, 100, 1000, 4096, 32768, 2**20)
# The presets with routed experts: hidden, experts, top_k.
MOE_PRESETS = {"qwen3-30b-a3b": (2048, 128, 8), "qwen3-235b-a22b": (4096, 128, 8),
               "deepseek-v3": (7168, 256, 8), "mixtral-8x7b": (4096, 8, 2)}


def problem(**overrides) -> MoEProblem:
    values = dict(num_tokens=1, dtype="bfloat16", hidden=2048, experts=128, top_k=8,
                  pad=moe_common.DEFAULT_PAD, expert_begin=0, expert_end=128)
    values.update(overrides)
    return MoEProblem(**values)


def test_registered_with_the_moe_contract():
    assert get_kernel("moe_combine") is KERNEL
    assert KERNEL.problem_type is MoEProblem
    assert KERNEL.problems_for_model is moe_common.problems_for_model
    assert KERNEL.space is SPACE
    assert KERNEL.outputs == ("out",)
    assert KERNEL.written_in_place == ()
    assert KERNEL.check is None  # a tolerance comparison judges the output


# ---------------------------------------------------------------------------------------------
# The space


def _vector(dtype: str, bits: int) -> int:
    return bits // 16  # both MoE dtypes are 16-bit


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_preset_points_obey_every_constraint(name):
    hidden, experts, top_k = MOE_PRESETS[name]
    (p,) = KERNEL.problems_for_model(PRESETS[name], "bfloat16")
    assert (p.hidden, p.experts, p.top_k) == (hidden, experts, top_k)
    enumeration = SPACE.enumerate(p, H200)
    # H = 2048 is 256 vectors: no 16-way split leaves a warp a vector each, and 8-warp blocks
    # need the whole row (11 points); 4096 admits 14; 7168 (896 vectors) those 14 and 7-, 14-
    # and 28-way splits: 128 vectors for 1 or 4 warps, 64 and 32 for 1 warp.
    assert vector_bits(p) == 128
    assert len(enumeration.valid) == {2048: 11, 4096: 14, 7168: 18}[hidden]
    for c in enumeration.valid:
        vectors = hidden // _vector(p.dtype, 128)
        assert vectors % c.hidden_split == 0, c
        assert c.hidden_split == 1 or c.tokens_per_block == 1, c
        assert c.tokens_per_block <= c.warps_per_block, c
        assert c.warps_per_block * 32 // c.tokens_per_block <= vectors // c.hidden_split, c
    assert {r.constraint for r in enumeration.rejected} <= {c.name for c in SPACE.constraints}


def test_rejections_name_their_constraint():
    rejected = {r.config: r.constraint for r in SPACE.enumerate(problem(), H200).rejected}
    assert rejected[CombineConfig(2, 2, 1)] == "one_grid_policy"
    assert rejected[CombineConfig(1, 2, 1)] == "whole_warps_per_token"
    assert rejected[CombineConfig(1, 4, 1)] == "whole_warps_per_token"
    # 2048 / 8 = 256 vectors: 16 slices of 16 leave half a warp idle; 4 of 64 leave 4 warps
    # three quarters idle; 4 tokens of 8 warps get 64 threads each, within 256.
    assert rejected[CombineConfig(16, 1, 1)] == "no_idle_threads"
    assert rejected[CombineConfig(4, 1, 4)] == "no_idle_threads"
    assert CombineConfig(1, 4, 8) not in rejected
    # fp16 H = 1002: 501 32-bit vectors, which no split of 2 or more divides.
    rejected = {r.config: r.constraint
                for r in SPACE.enumerate(problem(dtype="float16", hidden=1002), H200).rejected}
    assert rejected[CombineConfig(2, 1, 1)] == "split_into_whole_vectors"


def test_a_hidden_size_only_32_bit_vectors_divide():
    p = problem(dtype="float16", hidden=1002, top_k=4, experts=60, expert_end=60)
    enumeration = SPACE.enumerate(p, H200)
    assert vector_bits(p) == 32
    assert enumeration.valid == tuple(CombineConfig(1, t, w)
                                      for t in (1, 2, 4) for w in (1, 4, 8) if t <= w)
    assert enumeration.rejections_by_constraint() == {
        "split_into_whole_vectors": 63, "whole_warps_per_token": 2}
    # 64-bit vectors where 128-bit ones do not divide (1004 = 251 x 4).
    assert vector_bits(problem(hidden=1004)) == 64


def test_an_odd_hidden_size_has_no_point():
    with pytest.raises(EmptySpaceError, match="hidden_splits_into_vectors removed 72"):
        SPACE.valid_points(problem(hidden=1001), H200)
    with pytest.raises(EmptySpaceError, match="hidden_splits_into_vectors"):
        default_config(problem(hidden=1001), H200)


def test_top_k_beyond_the_unroll_limit_is_rejected_by_name():
    p = problem(top_k=MAX_TOP_K + 1, experts=64, expert_end=64)
    with pytest.raises(EmptySpaceError, match="top_k_unrollable removed"):
        SPACE.valid_points(p, H200)
    assert SPACE.valid_points(problem(top_k=MAX_TOP_K, experts=64, expert_end=64), H200)


def test_register_and_block_size_constraints_bind_on_a_smaller_device():
    # Nothing in the declared space exceeds an H200. A device with a quarter of the register
    # file and 64-thread blocks: top-k 8 at 128 bits estimates 32 + 32 + 8 + 16 = 88 registers.
    small = dataclasses.replace(H200, registers_per_sm=16384, max_threads_per_block=64)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(problem(), small).rejected}
    assert rejected[CombineConfig(1, 1, 8)] == "block_fits_register_file"  # 88 * 256
    assert rejected[CombineConfig(1, 1, 4)] == "block_size_within_device"  # 128 > 64
    assert CombineConfig(8, 1, 1) not in rejected


# ---------------------------------------------------------------------------------------------
# The seed heuristic


@pytest.mark.parametrize(("dtype", "hidden", "top_k"), [
    ("bfloat16", 2048, 8), ("bfloat16", 4096, 8), ("bfloat16", 7168, 8), ("bfloat16", 4096, 2),
    ("float16", 1002, 4), ("float16", 1004, 6), ("bfloat16", 5120, 1), ("float16", 256, 16),
])
def test_default_config_is_a_valid_point_with_the_widest_vector(dtype, hidden, top_k):
    for tokens in TOKENS:
        p = problem(dtype=dtype, hidden=hidden, top_k=top_k, num_tokens=tokens)
        config = default_config(p, H200)
        SPACE.check(p, config, H200)  # raises if not a valid point


def test_default_config_decode_uses_one_warp_blocks_prefill_large_ones():
    for tokens in TOKENS:
        p = problem(num_tokens=tokens, hidden=4096)
        config = default_config(p, H200)
        warps_needed = math.ceil(tokens * 4096 / 8 / 32)
        if warps_needed <= H200.sm_count:
            assert config.warps_per_block == 1, tokens
        if tokens >= 1000:
            assert config == CombineConfig(1, 1, 8), tokens
            assert cost(p, config, H200).blocks >= H200.sm_count


# ---------------------------------------------------------------------------------------------
# Cost


def test_cost_by_hand():
    # Qwen3-30B-A3B bf16, 3 tokens: 24 pairs of 2048-wide rows (2 bytes each) read, row_of
    # and the weights (4 + 4 bytes a pair) read, 3 rows written.
    p = problem(num_tokens=3)
    c = cost(p, CombineConfig(2, 1, 4), H200)
    assert c.bytes_moved == 24 * 2048 * 2 + 24 * 8 + 3 * 2048 * 2 == 110784
    assert c.flops == 2 * 24 * 2048
    assert c.blocks == 3 * 2
    assert c.threads_per_block == 128
    # 8 vectors of 8 bf16 in flight (one per pair): 8 x 4 registers, an 8-float accumulator,
    # 8 rows and 8 weights, 32 of addressing.
    assert c.registers_per_thread == 32 + 32 + 8 + 16
    assert c.bytes_in_flight_per_thread == 8 * 16
    assert c.smem_per_block == 8 * 8
    assert (c.launches, c.grid_barriers) == (1, 0)
    # Several tokens per block: fewer blocks, their pairs staged together.
    c = cost(problem(num_tokens=5), CombineConfig(1, 4, 8), H200)
    assert (c.blocks, c.threads_per_block, c.smem_per_block) == (2, 256, 4 * 8 * 8)


def test_cost_batches_of_pairs():
    # Mixtral: 2 pairs in flight. top-k 16 at 128 bits: two batches of 8.
    c = cost(problem(top_k=2, experts=8, expert_end=8, hidden=4096, num_tokens=1),
             CombineConfig(16, 1, 1), H200)
    assert c.bytes_in_flight_per_thread == 2 * 16
    assert c.blocks == 16
    c = cost(problem(top_k=16), CombineConfig(1, 1, 8), H200)
    assert c.bytes_in_flight_per_thread == 8 * 16
    assert c.registers_per_thread == 32 + 32 + 8 + 32
    # 32-bit vectors of fp16: 4 pairs of 4 bytes.
    c = cost(problem(dtype="float16", hidden=1002, top_k=4, num_tokens=7),
             CombineConfig(1, 1, 4), H200)
    assert c.bytes_in_flight_per_thread == 4 * 4
    assert c.bytes_moved == 28 * 1002 * 2 + 28 * 8 + 7 * 1002 * 2


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_every_valid_point_is_resident_on_every_device(name):
    # The register constraint must agree with the roofline's residency model, or ranking a
    # valid point would raise.
    (base,) = KERNEL.problems_for_model(PRESETS[name], "bfloat16")
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            p = base.with_tokens(tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


# ---------------------------------------------------------------------------------------------
# Model problems and peers


def test_model_problems_are_moe_commons():
    for name in MOE_PRESETS:
        assert KERNEL.problems_for_model(PRESETS[name], "float16") == \
            moe_common.problems_for_model(PRESETS[name], "float16")
    with pytest.raises(NotApplicableError, match="has no routed experts"):
        KERNEL.problems_for_model(PRESETS["qwen3-8b"], "bfloat16")


def test_liger_peer_says_when_it_cannot_serve():
    (peer,) = KERNEL.peers
    with pytest.raises(PeerUnavailable, match="local range"):
        peer.build(problem(expert_begin=32, expert_end=64))
    try:
        import liger_kernel.ops.fused_moe  # noqa: F401
    except ImportError:
        with pytest.raises(PeerUnavailable, match="liger-kernel with fused_moe is not installed"):
            peer.build(problem())
    else:
        assert callable(peer.build(problem()))
