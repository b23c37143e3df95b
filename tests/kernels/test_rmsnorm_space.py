"""rmsnorm: Problem, Config space, seed heuristic, cost, model problems, peers (no compiling)."""

import dataclasses
import math

import pytest

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.cache_hints import EVICT_LAST_LOADS, NORMAL
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.registry import PeerUnavailable, get_kernel
from cutetune.kernels.rmsnorm import (
    BLOCK_PER_ROW,
    KERNEL,
    SPACE,
    WARP_PER_ROW,
    RMSNormConfig,
    RMSNormProblem,
    cost,
    default_cache_hints,
    default_config,
    problems_for_model,
)
from cutetune.spaces.models import PRESETS
from cutetune.spaces.space import EmptySpaceError

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Powers of two, the non-powers of two, DeepSeek's lora widths, the range's ends.
HIDDEN = (64, 128, 256, 512, 1024, 1536, 2048, 2880, 4096, 5120, 5376, 7168, 8192, 16384)


def problem(**overrides) -> RMSNormProblem:
    values = dict(num_tokens=1, dtype="bfloat16", out_dtype="bfloat16", hidden=4096, eps=1e-6,
                  weight_bias=0.0, fused_add=False)
    values.update(overrides)
    return RMSNormProblem(**values)


def rejected_by(p: RMSNormProblem) -> dict[RMSNormConfig, str]:
    return {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}


def test_registered_under_its_name():
    assert get_kernel("rmsnorm") is KERNEL
    assert KERNEL.space is SPACE
    assert KERNEL.problem_type is RMSNormProblem
    assert KERNEL.outputs == ("out", "residual")
    assert KERNEL.written_in_place == ("residual",)
    assert {peer.name for peer in KERNEL.peers} == {"quack rmsnorm", "liger rms_norm"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "int8", "dtype 'int8' not supported"),
    ("out_dtype", "float64", "out_dtype 'float64' not supported"),
    ("hidden", 32, "hidden 32 not supported: use 64 to 16384"),
    ("hidden", 16385, "hidden 16385 not supported"),
    ("hidden", 4096.0, "hidden 4096.0 not supported"),
    ("weight_bias", 0.5, "weight_bias must be 0 or 1"),
    ("eps", 0.0, "eps must be positive"),
    ("fused_add", 1, "fused_add must be a bool"),
    ("num_tokens", 0, "num_tokens must be a positive integer"),
])
def test_problem_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        problem(**{field: value})


def test_problem_key_is_static_part_only():
    a, b = problem(num_tokens=1), problem(num_tokens=4096)
    assert a.static_key() == b.static_key()
    assert a.static_tuple() == ("bfloat16", "bfloat16", 4096, 1e-6, 0.0, False)
    assert a.static_key() != problem(fused_add=True).static_key()
    assert a.static_key() != problem(out_dtype="float32").static_key()


# ---------------------------------------------------------------------------------------------
# Constraints


# Every point of the space: 2 forms x 3 vector widths x 6 warp counts x 3 cache hints.
DECLARED = 2 * 3 * 6 * 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fused_add", [False, True])
def test_odd_hidden_is_rejected_everywhere_with_the_reason(dtype, fused_add):
    # 2881 is odd: not even a 32-bit vector (two 16-bit elements) divides it.
    p = problem(dtype=dtype, out_dtype=dtype, hidden=2881, fused_add=fused_add)
    enumeration = SPACE.enumerate(p, H200)
    assert not enumeration.valid
    assert enumeration.rejections_by_constraint() == {"hidden_splits_into_vectors": DECLARED}
    reason = enumeration.rejected[0].reason
    assert "hidden must be a multiple of the vector" in reason
    with pytest.raises(EmptySpaceError, match=f"hidden_splits_into_vectors removed {DECLARED}"):
        SPACE.valid_points(p, H200)
    with pytest.raises(EmptySpaceError, match="hidden=2881"):
        default_config(p, H200)


def test_odd_hidden_in_fp32_takes_only_one_element_vectors():
    p = problem(dtype="float32", out_dtype="float32", hidden=2881)
    valid = SPACE.enumerate(p, H200).valid
    assert valid and {c.vector_bits for c in valid} == {32}
    # fp32 in, bf16 out: the widest element is still fp32, one per 32-bit vector.
    valid = SPACE.enumerate(dataclasses.replace(p, out_dtype="bfloat16"), H200).valid
    assert valid and {c.vector_bits for c in valid} == {32}


def test_hidden_2880_is_valid_with_a_predicated_last_vector():
    # bf16 128-bit: 360 vectors; 4 warps = 128 threads own 3 slots each, the third for only
    # 104 of them.
    p = problem(hidden=2880)
    valid = SPACE.enumerate(p, H200).valid
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 4) in valid
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 8) in valid  # 2 slots, the second for 104
    assert {c.vector_bits for c in valid} == {32, 64, 128}
    # Every point comes with plain and streaming accesses and with evict_last loads.
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 4, "streaming") in valid
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 4, "evict_last_loads") in valid
    assert {c.cache_hints for c in valid} == {"normal", "streaming", "evict_last_loads"}


def test_evict_last_loads_needs_whole_words():
    # bf16 in, fp32 out, 32-bit vectors: one bf16 element per load of x, not a 32-bit word.
    p = problem(out_dtype="float32")
    rejected = rejected_by(p)
    assert rejected[RMSNormConfig(BLOCK_PER_ROW, 32, 8, "evict_last_loads")] == (
        "evict_last_loads_whole_words")
    valid = SPACE.enumerate(p, H200).valid
    assert RMSNormConfig(BLOCK_PER_ROW, 32, 8, "normal") in valid
    assert RMSNormConfig(BLOCK_PER_ROW, 64, 8, "evict_last_loads") in valid


def test_no_idle_threads():
    # bf16 4096: 512 vectors of 128 bits, so 32 warps (1024 threads) would leave half idle.
    assert rejected_by(problem())[RMSNormConfig(BLOCK_PER_ROW, 128, 32)] == "no_idle_threads"
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 16) in SPACE.enumerate(problem(), H200).valid
    # 256 bf16 elements are 32 vectors: one warp is all a row can use.
    small = problem(hidden=256)
    assert rejected_by(small)[RMSNormConfig(BLOCK_PER_ROW, 128, 2)] == "no_idle_threads"
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 1) in SPACE.enumerate(small, H200).valid
    assert RMSNormConfig(WARP_PER_ROW, 128, 8) in SPACE.enumerate(small, H200).valid


def test_warp_per_row_only_where_the_row_fits_one_warp():
    # 2048 bf16 elements are 64 per lane (the bound); 2880 would be 96.
    assert RMSNormConfig(WARP_PER_ROW, 128, 4) in SPACE.enumerate(problem(hidden=2048),
                                                                  H200).valid
    rejected = rejected_by(problem(hidden=2880))
    assert rejected[RMSNormConfig(WARP_PER_ROW, 128, 4)] == "row_fits_one_warp"
    for config in SPACE.enumerate(problem(hidden=4096), H200).valid:
        assert config.form == BLOCK_PER_ROW


def test_register_and_unroll_bounds():
    # bf16 4096 with one warp: 16 vectors of 8 = 128 elements per thread.
    rejected = rejected_by(problem())
    assert rejected[RMSNormConfig(BLOCK_PER_ROW, 128, 1)] == "row_fits_registers"
    # 32-bit bf16 vectors over 2 warps: 32 vectors of 2 = 64 elements, but 32 accesses.
    assert rejected[RMSNormConfig(BLOCK_PER_ROW, 32, 2)] == "vectors_per_thread_unrollable"
    # 1024 bf16 per warp at 32 rows per block: 32 elements per lane, (32 + 64) registers x
    # 1024 threads > 64K.
    rejected = rejected_by(problem(hidden=1024))
    assert rejected[RMSNormConfig(WARP_PER_ROW, 128, 32)] == "block_fits_register_file"


def test_vector_counts_the_widest_dtype():
    # bf16 in, fp32 out: a 128-bit vector is 4 elements (128-bit stores, 64-bit loads), so
    # 4096 elements are 1024 vectors and 32 warps leave nobody idle.
    p = problem(out_dtype="float32")
    assert RMSNormConfig(BLOCK_PER_ROW, 128, 32) in SPACE.enumerate(p, H200).valid
    c = cost(p, RMSNormConfig(BLOCK_PER_ROW, 128, 4), H200)
    assert c.bytes_in_flight_per_thread == 8 * 4 * 2  # 8 vectors of 4 bf16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_every_valid_point_is_sound(dtype, out_dtype, hidden):
    for fused_add in (False, True):
        p = problem(dtype=dtype, out_dtype=out_dtype, hidden=hidden, fused_add=fused_add)
        enumeration = SPACE.enumerate(p, H200)
        assert enumeration.declared == DECLARED
        assert enumeration.valid, p.describe()
        widest = max(ELEMENT_BYTES[dtype], ELEMENT_BYTES[out_dtype])
        for config in enumeration.valid:
            vector = config.vector_bits // (8 * widest)
            vectors = hidden // vector
            threads = 32 * (config.warps_per_block if config.form == BLOCK_PER_ROW else 1)
            per_thread = math.ceil(vectors / threads)
            assert vector >= 1 and hidden % vector == 0, config
            assert threads <= vectors, config
            assert per_thread * vector <= 64 and per_thread <= 16, config
            # Every access is one whole vector of at most 128 bits of its dtype.
            assert vector * ELEMENT_BYTES[dtype] <= 16 and vector * ELEMENT_BYTES[out_dtype] <= 16
        for rejection in enumeration.rejected:
            assert rejection.constraint in {c.name for c in SPACE.constraints}


@pytest.mark.parametrize("hidden", HIDDEN)
def test_every_valid_point_is_resident_on_every_device(hidden):
    # The register constraint must agree with the roofline's residency model, or ranking a
    # valid point would raise.
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            for dtype in ("bfloat16", "float32"):
                p = problem(dtype=dtype, out_dtype=dtype, hidden=hidden, num_tokens=tokens,
                            fused_add=True)
                for config in SPACE.enumerate(p, device).valid:
                    c = cost(p, config, device)
                    assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                    assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


# ---------------------------------------------------------------------------------------------
# Seed heuristic

TOKENS = (1, 2, 7, 64, 132, 133, 512, 4096, 2**20)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN + (2882, 258))
def test_default_config_is_a_valid_point(dtype, hidden):
    for tokens in TOKENS:
        for fused_add in (False, True):
            p = problem(dtype=dtype, out_dtype=dtype, hidden=hidden, num_tokens=tokens,
                        fused_add=fused_add)
            config = default_config(p, H200)
            SPACE.check(p, config, H200)  # raises if not a valid point
            # The widest vector that divides the row.
            widest = max(c.vector_bits for c in SPACE.enumerate(p, H200).valid)
            assert config.vector_bits == widest


def test_default_keeps_the_point_when_its_hint_is_invalid():
    # bf16 rows with an fp32 output at 32-bit vectors load single 16-bit elements, which
    # evict_last_loads does not: the default keeps the point with another hint.
    p = problem(hidden=4097, out_dtype="float32", num_tokens=65536)
    assert default_cache_hints(p, H200) == EVICT_LAST_LOADS
    config = default_config(p, H200)
    assert (config.vector_bits, config.cache_hints) == (32, NORMAL)


def test_default_config_narrows_the_vector_when_128_bits_do_not_divide():
    # 2882 bf16: only 2-element (32-bit) vectors divide it.
    config = default_config(problem(hidden=2882), H200)
    assert config.vector_bits == 32 and config.form == BLOCK_PER_ROW


# ---------------------------------------------------------------------------------------------
# Cost


def test_cost_by_hand_fused_add():
    # bf16, 4096 wide, 3 rows, fused: x read, residual read and written, out written, 2 bytes
    # each, plus the weight once: 3 * 4096 * 8 + 4096 * 2 = 106496 bytes.
    p = problem(num_tokens=3, fused_add=True)
    c = cost(p, RMSNormConfig(BLOCK_PER_ROW, 128, 4), H200)
    assert c.bytes_moved == 3 * 4096 * (2 + 2 + 2 + 2) + 4096 * 2 == 106496
    assert c.flops == 5 * 3 * 4096
    assert (c.blocks, c.threads_per_block) == (3, 128)
    # 512 vectors over 128 threads: 4 per thread, 32 elements, x and residual in flight.
    assert c.bytes_in_flight_per_thread == 32 * 2 * 2
    assert c.registers_per_thread == 32 + 2 * 32
    assert c.smem_per_block == 4 * 4  # one float per warp
    assert (c.launches, c.grid_barriers) == (1, 0)


def test_cost_by_hand_plain_warp_per_row_with_wider_output():
    # bf16 in, fp32 out, 1024 wide, 10 rows: 10 * 1024 * (2 + 4) + 1024 * 2 = 63488 bytes.
    p = problem(num_tokens=10, hidden=1024, out_dtype="float32")
    c = cost(p, RMSNormConfig(WARP_PER_ROW, 128, 4), H200)
    assert c.bytes_moved == 10 * 1024 * (2 + 4) + 1024 * 2 == 63488
    assert c.flops == 4 * 10 * 1024
    # 4 rows per block: ceil(10 / 4) blocks of 128 threads, no shared memory.
    assert (c.blocks, c.threads_per_block, c.smem_per_block) == (3, 128, 0)
    # 4-element vectors (128-bit fp32 stores): 256 per row, 8 per lane, 32 elements.
    assert c.bytes_in_flight_per_thread == 32 * 2
    assert c.registers_per_thread == 32 + 2 * 32


# ---------------------------------------------------------------------------------------------
# Model problems


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_problems_for_every_preset(name, dtype):
    model = PRESETS[name]
    problems = problems_for_model(model, dtype)
    common = dict(num_tokens=1, dtype=dtype, out_dtype=dtype, eps=model.rms_norm_eps,
                  weight_bias=model.norm_weight_bias)
    expected = [RMSNormProblem(hidden=model.hidden_size, fused_add=False, **common),
                RMSNormProblem(hidden=model.hidden_size, fused_add=True, **common)]
    expected += [RMSNormProblem(hidden=w, fused_add=False, **common)
                 for w in model.extra_norm_widths]
    assert problems == expected
    for p in problems:
        assert SPACE.enumerate(p, H200).valid, p.describe()


def test_deepseek_v3_normalises_its_lora_widths():
    problems = problems_for_model(PRESETS["deepseek-v3"], "bfloat16")
    assert [(p.hidden, p.fused_add) for p in problems] == [
        (7168, False), (7168, True), (1536, False), (512, False)]
    assert {p.eps for p in problems} == {1e-6}


def test_gemma_style_model_gets_weight_bias_one():
    gemma = dataclasses.replace(PRESETS["qwen3-8b"], name="gemma-like", norm_weight_bias=1.0)
    assert {p.weight_bias for p in KERNEL.problems_for_model(gemma, "bfloat16")} == {1.0}


# ---------------------------------------------------------------------------------------------
# Peers: what each can serve is decided before its library is imported where it can be


def _peer(name):
    return next(peer for peer in KERNEL.peers if peer.name == name)


def test_peers_say_why_they_cannot_serve():
    wide = problem(out_dtype="float32", fused_add=True)
    for name in ("quack rmsnorm", "liger rms_norm"):
        # Either the library is missing here or it cannot write this math: both are
        # PeerUnavailable with a reason, never another error.
        with pytest.raises(PeerUnavailable, match=r"\S"):
            _peer(name).build(wide)
