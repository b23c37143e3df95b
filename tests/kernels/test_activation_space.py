"""silu_and_mul and gelu_and_mul: Problems, the shared Config space, the seed heuristic, cost
and model problems (no compiling)."""

import dataclasses
import math

import pytest

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels import activation as act
from cutetune.kernels.activation import (
    GELU_KERNEL,
    SILU_KERNEL,
    SPACE,
    ActivationConfig,
    GeluAndMulProblem,
    SiluAndMulProblem,
    cost,
    default_config,
)
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.spaces.models import PRESETS, ModelShape
from cutetune.spaces.space import EmptySpaceError

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# MLP widths of the presets (dense and expert), plus widths that are not powers of two and
# narrow ones that only some vectors divide.
WIDTHS = (768, 1000, 1536, 2048, 3072, 6912, 12288, 14336, 18432, 25600, 28672)
TOKENS = (1, 2, 3, 7, 64, 100, 512, 4096, 2**20)


def silu(**overrides) -> SiluAndMulProblem:
    values = dict(num_tokens=1, dtype="bfloat16", intermediate=14336)
    values.update(overrides)
    return SiluAndMulProblem(**values)


def gelu(**overrides) -> GeluAndMulProblem:
    values = dict(num_tokens=1, dtype="bfloat16", intermediate=14336, approximate="tanh")
    values.update(overrides)
    return GeluAndMulProblem(**values)


def test_both_kernels_are_registered_over_one_space():
    assert get_kernel("silu_and_mul") is SILU_KERNEL
    assert get_kernel("gelu_and_mul") is GELU_KERNEL
    assert SILU_KERNEL.problem_type is SiluAndMulProblem
    assert GELU_KERNEL.problem_type is GeluAndMulProblem
    assert SILU_KERNEL.space is GELU_KERNEL.space is SPACE
    assert SILU_KERNEL.outputs == GELU_KERNEL.outputs == ("out",)
    assert SILU_KERNEL.written_in_place == GELU_KERNEL.written_in_place == ()


@pytest.mark.parametrize(("make", "field", "value", "message"), [
    (silu, "dtype", "int8", "dtype 'int8' not supported"),
    (silu, "dtype", "float64", "dtype 'float64' not supported"),
    (silu, "intermediate", 0, "intermediate must be a positive integer"),
    (silu, "intermediate", -8, "intermediate must be a positive integer"),
    (silu, "intermediate", 8.0, "intermediate must be a positive integer"),
    (silu, "intermediate", True, "intermediate must be a positive integer"),
    (silu, "num_tokens", 0, "num_tokens must be a positive integer"),
    (gelu, "approximate", "exact", "approximate must be one of"),
    (gelu, "approximate", None, "approximate must be one of"),
    (gelu, "dtype", "int8", "dtype 'int8' not supported"),
])
def test_problem_validation(make, field, value, message):
    with pytest.raises(ValueError, match=message):
        make(**{field: value})


def test_problem_keys_are_static_and_name_the_math():
    assert silu().static_tuple() == ("bfloat16", 14336)
    assert silu(num_tokens=1).static_key() == silu(num_tokens=4096).static_key()
    assert gelu().static_tuple() == ("bfloat16", 14336, "tanh")
    assert gelu().static_key() != gelu(approximate="none").static_key()
    assert silu().activation == act.SILU
    assert gelu().activation == act.GELU_TANH
    assert gelu(approximate="none").activation == act.GELU_ERF
    with pytest.raises(TypeError):
        SiluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=8, approximate="tanh")


# ---------------------------------------------------------------------------------------------
# The space


def _widest(dtype: str, width: int) -> int:
    return next(bits for bits in (128, 64, 32) if width % (bits // 8 // ELEMENT_BYTES[dtype]) == 0)


# Every dtype and width some vector divides (odd 16-bit widths: tested below).
DIVISIBLE = [(d, w) for d in DTYPES for w in WIDTHS + (1002, 1004, 1001)
             if d == "float32" or w % 2 == 0]


@pytest.mark.parametrize(("dtype", "width"), DIVISIBLE)
def test_valid_points_are_every_vector_that_divides_the_width(dtype, width):
    # Narrow vectors and fewer bytes per thread stay in the space: at a few tokens they can
    # win (the comment at MIN_BITS_PER_THREAD says what was measured).
    p = silu(dtype=dtype, intermediate=width)
    enumeration = SPACE.enumerate(p, H200)
    assert enumeration.declared == 54
    dividing = [bits for bits in (128, 64, 32) if width % (bits // 8 // ELEMENT_BYTES[dtype]) == 0]
    assert dividing[0] == _widest(dtype, width)
    assert {c.vector_bits for c in enumeration.valid} == set(dividing)
    assert len(enumeration.valid) == 18 * len(dividing)
    # Each point comes with plain and with streaming accesses.
    assert {c.cache_hints for c in enumeration.valid} == {"normal", "streaming"}
    for config in enumeration.valid:
        assert config.warps_per_block * 32 <= H200.max_threads_per_block
    assert {r.constraint for r in enumeration.rejected} <= {"intermediate_splits_into_vectors"}


def test_vectors_that_do_not_divide_the_width_are_rejected_by_name():
    # bf16 I=14336 takes every vector width.
    assert {c.vector_bits for c in SPACE.enumerate(silu(), H200).valid} == {32, 64, 128}
    # bf16 I=1004 (251 x 4): 64-bit and 32-bit vectors, even one 32-bit vector per thread.
    enumeration = SPACE.enumerate(silu(intermediate=1004), H200)
    rejected = {r.config: r.constraint for r in enumeration.rejected}
    assert rejected[ActivationConfig(128, 1, 4)] == "intermediate_splits_into_vectors"
    assert ActivationConfig(64, 1, 4) in enumeration.valid
    assert ActivationConfig(32, 1, 1) in enumeration.valid


def test_a_width_only_32_bit_vectors_divide():
    # bf16 I=1002: 501 pairs, not a whole number of 64- or 128-bit vectors.
    enumeration = SPACE.enumerate(silu(intermediate=1002), H200)
    assert enumeration.valid == tuple(ActivationConfig(32, n, w, hints)
                                      for n in (1, 2, 4) for w in (1, 4, 8)
                                      for hints in ("normal", "streaming"))
    assert enumeration.rejections_by_constraint() == {"intermediate_splits_into_vectors": 36}
    assert default_config(silu(intermediate=1002), H200) == ActivationConfig(32, 4, 1)
    # In fp32 a 32-bit vector is one element: every width works.
    assert SPACE.enumerate(silu(dtype="float32", intermediate=1001), H200).valid


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_width_no_vector_divides_is_rejected_by_name(dtype):
    p = silu(dtype=dtype, intermediate=1001)
    with pytest.raises(EmptySpaceError,
                       match="intermediate_splits_into_vectors removed 54"):
        SPACE.valid_points(p, H200)
    with pytest.raises(EmptySpaceError, match="intermediate_splits_into_vectors"):
        default_config(p, H200)


def test_register_and_block_size_constraints_bind_on_a_smaller_device():
    # Nothing in the declared space exceeds an H200; a device with a quarter of the register
    # file and 128-thread blocks rejects the large blocks by name.
    small = dataclasses.replace(H200, registers_per_sm=16384, max_threads_per_block=128)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(silu(), small).rejected}
    # 128-bit bf16, 4 vectors: 32 + 2 * 4 * 8 = 96 registers * 256 threads > 16384.
    assert rejected[ActivationConfig(128, 4, 8)] == "block_fits_register_file"
    # 128-bit, 1 vector: 48 registers * 256 threads fit 16384 (12288), but 256 > 128.
    assert rejected[ActivationConfig(128, 1, 8)] == "block_size_within_device"
    assert ActivationConfig(128, 4, 4) not in rejected


# ---------------------------------------------------------------------------------------------
# The seed heuristic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_default_config_is_a_valid_point(dtype, width):
    for tokens in TOKENS:
        for p in (silu(dtype=dtype, intermediate=width, num_tokens=tokens),
                  gelu(dtype=dtype, intermediate=width, num_tokens=tokens)):
            config = default_config(p, H200)
            SPACE.check(p, config, H200)  # raises if not a valid point
            assert config.vector_bits == _widest(dtype, width)
            assert config.vectors_per_thread == 128 // config.vector_bits


@pytest.mark.parametrize("tokens", [1, 9, 10, 18, 19, 4096, 2**20])
def test_default_config_warps_give_every_sm_a_block(tokens):
    # Blocks of more than one warp only where there are still blocks for every SM.
    config = default_config(silu(num_tokens=tokens), H200)
    blocks = cost(silu(num_tokens=tokens), config, H200).blocks
    assert config.warps_per_block == 1 or blocks >= H200.sm_count


# ---------------------------------------------------------------------------------------------
# Cost


def test_cost_by_hand():
    # Llama-3.1-8B bf16, 3 tokens: 3 * 14336 = 43008 outputs; gate and up read (2 * 43008 * 2
    # bytes) and out written (43008 * 2): 258048 bytes.
    p = silu(num_tokens=3)
    c = cost(p, ActivationConfig(vector_bits=128, vectors_per_thread=2, warps_per_block=4),
             H200)
    assert c.bytes_moved == 3 * 43008 * 2 == 258048
    assert c.flops == 6 * 43008
    # 5376 vectors of 8, 256 vectors a block (128 threads x 2): 21 blocks.
    assert c.blocks == math.ceil(3 * 14336 / 8 / 256) == 21
    assert c.threads_per_block == 128
    # Two 16-byte vectors of gate and two of up loaded before the first store.
    assert c.bytes_in_flight_per_thread == 64
    assert c.registers_per_thread == 32 + 2 * 2 * 8
    assert (c.launches, c.grid_barriers, c.smem_per_block) == (1, 0, 0)


def test_cost_scales_with_dtype_and_math():
    config = ActivationConfig(vector_bits=128, vectors_per_thread=1, warps_per_block=8)
    fp32 = cost(silu(dtype="float32", num_tokens=5, intermediate=1000), config, H200)
    assert fp32.bytes_moved == 3 * 5 * 1000 * 4
    # 1250 vectors of 4 over 256-vector blocks.
    assert fp32.blocks == 5
    flops = {form: cost(gelu(approximate=form), config, H200).flops for form in ("none", "tanh")}
    assert cost(silu(), config, H200).flops < flops["tanh"] < flops["none"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_valid_point_is_resident_on_every_device(dtype):
    # The register constraint must agree with the roofline's residency model, or ranking a
    # valid point would raise.
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            p = silu(dtype=dtype, num_tokens=tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


# ---------------------------------------------------------------------------------------------
# Model problems

EXPECTED_WIDTHS = {
    "qwen3-0.6b": [3072],
    "qwen3-8b": [12288],
    "qwen3-32b": [25600],
    "qwen3-30b-a3b": [768],
    "qwen3-235b-a22b": [1536],
    "llama-3.1-8b": [14336],
    "llama-3.1-8b-fp4": [14336],
    "llama-3.1-70b": [28672],
    "deepseek-v3": [18432, 2048],  # dense layers, then the routed (and shared) experts
    "mixtral-8x7b": [14336],
}


def test_expected_widths_cover_every_preset():
    assert set(EXPECTED_WIDTHS) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(EXPECTED_WIDTHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_problems_for_presets(name, dtype):
    widths = EXPECTED_WIDTHS[name]
    assert SILU_KERNEL.problems_for_model(PRESETS[name], dtype) == [
        SiluAndMulProblem(num_tokens=1, dtype=dtype, intermediate=w) for w in widths]
    # Every preset's MLP is SwiGLU: gelu_and_mul says it does not apply.
    with pytest.raises(NotApplicableError, match=f"model {name} uses the activation 'silu'; "
                       "gelu_and_mul computes gelu, gelu_pytorch_tanh"):
        GELU_KERNEL.problems_for_model(PRESETS[name], dtype)


@pytest.mark.parametrize(("act", "form"), [("gelu", "none"), ("gelu_pytorch_tanh", "tanh")])
def test_a_gelu_model_gets_gelu_problems_in_its_form_and_no_silu(act, form):
    model = dataclasses.replace(PRESETS["llama-3.1-8b"], name="geglu", hidden_act=act)
    assert GELU_KERNEL.problems_for_model(model, "bfloat16") == [
        GeluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=14336,
                          approximate=form)]
    with pytest.raises(NotApplicableError, match=f"uses the activation '{act}'; silu_and_mul"):
        SILU_KERNEL.problems_for_model(model, "bfloat16")


def test_a_width_shared_by_dense_and_expert_mlps_is_one_problem():
    model = ModelShape("dense-and-moe", 4096, 32, 8, 128, 1e-6, False, 64, 4, 11008,
                       intermediate_size=11008)
    assert [p.intermediate for p in SILU_KERNEL.problems_for_model(model, "bfloat16")] == [11008]


@pytest.mark.parametrize(("kernel", "act"), [(SILU_KERNEL, "silu"), (GELU_KERNEL, "gelu")],
                         ids=("silu", "gelu"))
def test_not_applicable_without_an_mlp_width(kernel, act):
    model = ModelShape("attention-only", 1024, 16, 8, 64, 1e-6, False, hidden_act=act)
    with pytest.raises(NotApplicableError,
                       match=f"model attention-only declares no MLP width .* so {kernel.name}"):
        kernel.problems_for_model(model, "bfloat16")


def test_preset_problems_have_valid_points_and_128_bit_defaults():
    for model in PRESETS.values():
        for p in SILU_KERNEL.problems_for_model(model, "bfloat16"):
            assert SPACE.valid_points(p, H200)
            default = SILU_KERNEL.default_config(p, H200)
            assert default.vector_bits == 128 and default.cache_hints == "normal"


def test_liger_peers_say_when_they_cannot_serve():
    from cutetune.kernels.registry import PeerUnavailable

    (geglu,) = GELU_KERNEL.peers
    with pytest.raises(PeerUnavailable, match="tanh form of GELU only"):
        geglu.build(gelu(approximate="none"))
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        for peer in SILU_KERNEL.peers + GELU_KERNEL.peers:
            with pytest.raises(PeerUnavailable, match="liger-kernel is not installed"):
                peer.build(gelu(approximate="tanh"))
