"""mxfp8_quant and nvfp4_quant: Problems, the shared space and its named constraints, the seed
heuristic, cost, model problems, and the torch reference on values worked by hand (no
compiling)."""

import dataclasses

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.block_quant import (
    MXFP8_KERNEL,
    NVFP4_KERNEL,
    SPACE,
    BlockQuantConfig,
    MXFP8QuantProblem,
    NVFP4QuantProblem,
    _e2m1_codes,
    cost,
    default_config,
    make_inputs,
    quantised,
    reference,
)
from cutetune.kernels.registry import NotApplicableError, VerificationError, get_kernel
from cutetune.spaces.models import PRESETS
from testkit.capturable import run_on_meta

H200, B200 = DEVICE_SPECS["H200"], DEVICE_SPECS["B200"]


def mx(**overrides) -> MXFP8QuantProblem:
    return MXFP8QuantProblem(**{"num_tokens": 1, "dtype": "bfloat16", "hidden": 4096,
                                "scale_layout": "swizzled", **overrides})


def nv(**overrides) -> NVFP4QuantProblem:
    return NVFP4QuantProblem(**{"num_tokens": 1, "dtype": "bfloat16", "hidden": 4096,
                                "scale_layout": "swizzled", **overrides})


def test_both_kernels_are_registered_over_one_space():
    assert get_kernel("mxfp8_quant") is MXFP8_KERNEL
    assert get_kernel("nvfp4_quant") is NVFP4_KERNEL
    assert MXFP8_KERNEL.space is NVFP4_KERNEL.space is SPACE
    assert MXFP8_KERNEL.outputs == NVFP4_KERNEL.outputs == ("q", "scales")


@pytest.mark.parametrize(("make", "field", "value", "message"), [
    (mx, "dtype", "float32", "dtype 'float32' not supported"),
    (mx, "hidden", 48, "multiple of mxfp8's block of 32"),
    (nv, "hidden", 40, "multiple of nvfp4's block of 16"),
    (nv, "hidden", 0, "multiple of nvfp4's block of 16"),
    (mx, "scale_layout", "column_major", "scale_layout must be one of"),
])
def test_problem_validation(make, field, value, message):
    with pytest.raises(ValueError, match=message):
        make(**{field: value})


def test_wide_loads_only_on_sm_100():
    h200 = SPACE.enumerate(nv(), H200)
    rejected = {r.config: r.constraint for r in h200.rejected}
    assert rejected[BlockQuantConfig(256, 1, 4)] == "wide_access_needs_sm_100"
    assert {c.vector_bits for c in h200.valid} == {64, 128}
    assert {c.vector_bits for c in SPACE.enumerate(nv(), B200).valid} == {64, 128, 256}
    assert len(SPACE.enumerate(mx(), B200).valid) == 27


def test_register_and_block_constraints_bind_on_a_smaller_device():
    small = dataclasses.replace(B200, registers_per_sm=16384, max_threads_per_block=128)
    rejected = {r.config: r.constraint for r in SPACE.enumerate(mx(), small).rejected}
    # 256-bit bf16, 4 vectors: 32 + 2 * 4 * 16 = 160 registers * 128 threads > 16384.
    assert rejected[BlockQuantConfig(256, 4, 4)] == "block_fits_register_file"
    assert rejected[BlockQuantConfig(64, 1, 8)] == "block_size_within_device"


@pytest.mark.parametrize("tokens", [1, 7, 64, 512, 4096, 32768])
@pytest.mark.parametrize("make", [mx, nv])
def test_default_config_is_valid_and_warps_give_every_sm_a_block(make, tokens):
    for device in (H200, B200):
        problem = make(num_tokens=tokens)
        config = default_config(problem, device)
        SPACE.check(problem, config, device)
        assert config.vector_bits == 128
        data_blocks = tokens * 4096 // 8 // (config.warps_per_block * 32)
        assert config.warps_per_block == 1 or data_blocks >= device.sm_count


def test_cost_by_hand():
    # NVFP4, 3 tokens of 4096 bf16: x 24576 bytes, q 6144, swizzled scales 128 x 256 bytes,
    # the global scale 4 bytes.
    config = BlockQuantConfig(128, 2, 4)
    c = cost(nv(num_tokens=3), config, H200)
    assert c.bytes_moved == 3 * 4096 * 2 + 3 * 2048 + 128 * 256 + 4
    # 1536 vectors of 8 over 256-vector blocks: 6; the padding's 125 rows x 64 words over 256.
    assert c.blocks == 6 + 32
    assert c.bytes_in_flight_per_thread == 32
    row_major = cost(mx(num_tokens=3, scale_layout="row_major"), config, H200)
    assert row_major.bytes_moved == 3 * 4096 * 2 + 3 * 4096 + 3 * 128
    assert row_major.blocks == 6


def test_model_problems_follow_activation_quant():
    model = PRESETS["llama-3.1-8b-fp4"]
    problems = NVFP4_KERNEL.problems_for_model(model, "bfloat16")
    assert [p.hidden for p in problems] == [4096, 14336]
    assert {p.scale_layout for p in problems} == {"swizzled"}
    with pytest.raises(NotApplicableError, match="does not quantise its activations to mxfp8"):
        MXFP8_KERNEL.problems_for_model(model, "bfloat16")
    with pytest.raises(NotApplicableError, match="reads as none"):
        NVFP4_KERNEL.problems_for_model(PRESETS["qwen3-8b"], "bfloat16")
    mx_model = dataclasses.replace(model, activation_quant=dataclasses.replace(
        model.activation_quant, format="mxfp8", group_size=32))
    assert [p.hidden for p in MXFP8_KERNEL.problems_for_model(mx_model, "bfloat16")] == [
        4096, 14336]
    # A width the block does not divide refuses the kernel, naming the widths, rather than
    # being left out unsaid.
    odd = dataclasses.replace(model, hidden_size=4104, intermediate_size=14344)
    with pytest.raises(NotApplicableError, match="to nvfp4 in blocks of 16, which do not "
                       "divide its hidden size 4104, intermediate size 14344$"):
        NVFP4_KERNEL.problems_for_model(odd, "bfloat16")
    with pytest.raises(NotApplicableError, match="which do not divide its attention width 3300$"):
        NVFP4_KERNEL.problems_for_model(dataclasses.replace(model, num_q_heads=33, head_dim=100),
                                        "bfloat16")


# ---------------------------------------------------------------------------------------------
# The reference, worked by hand


def _bytes(t: torch.Tensor) -> list[int]:
    return t.view(torch.uint8).flatten().tolist()


def test_nvfp4_rounds_to_nearest_even():
    # global scale 1 and amax 6: s = e4m3(1.0) = 1, so q = e2m1(x): every rounding tie of e2m1
    # goes to the even code.
    x = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0,
                       0.2, -0.8, 1.3, -2.9, 5.5, -0.0, 4.5, -6.0]], dtype=torch.bfloat16)
    q, s = quantised(x, nv(hidden=16, scale_layout="row_major"), torch.tensor([1.0]))
    codes = [0, 2, 2, 4, 4, 6, 6, 7, 0, 10, 3, 13, 7, 8, 6, 15]
    assert _bytes(q) == [codes[i] | codes[i + 1] << 4 for i in range(0, 16, 2)]
    assert q.dtype == torch.float4_e2m1fn_x2 and _bytes(s) == [0x38]  # e4m3 1.0


def test_nvfp4_scale_is_e4m3_of_amax_over_6_times_the_global_scale():
    x = torch.full((1, 16), 3.0, dtype=torch.bfloat16)
    x[0, 0] = 96.0
    # s = e4m3(96 / 6 * 0.5) = 8 (0x50); q = e2m1(x * 0.5 / 8): 96 -> 6, 3 -> 0.1875 -> 0.
    q, s = quantised(x, nv(hidden=16, scale_layout="row_major"), torch.tensor([0.5]))
    assert _bytes(s) == [0x50] and _bytes(q) == [7] + [0] * 7


def test_special_blocks():
    nan = float("nan")
    block = torch.ones(3, 32, dtype=torch.bfloat16)
    block[0, 5] = nan
    block[1, 3] = -float("inf")
    block[2] = 0.0
    block[2, 1] = -0.0
    q, s = quantised(block, mx(hidden=32, scale_layout="row_major"))
    assert _bytes(s) == [0xFF, 120 + 127, 0]
    assert set(_bytes(q[0])) == {0}  # a NaN block's elements are +0
    assert _bytes(q[1])[3] == 0xFE and set(_bytes(q[1])[:3]) == {0}  # -inf -> -448
    assert _bytes(q[2])[:3] == [0, 0x80, 0]
    q, s = quantised(block[:, :16], nv(hidden=16, scale_layout="row_major"),
                     torch.tensor([1.0]))
    assert _bytes(s) == [0x7F, 0x7E, 0]  # NaN; saturated to 448; zero
    assert set(_bytes(q[0])) == {0}
    assert _bytes(q[1])[1] == 0xF0  # -inf -> -6 in the high nibble of pair 1 (element 3)
    assert _bytes(q[2])[0] == 0x80  # -0 kept


def test_mxfp8_uses_the_ocp_floor_exponent():
    # amax 496: floor(log2) = 8, shared exponent 0 (E8M0 127): 496 saturates to 448, 272 (a
    # tie between 256 and 288) goes to even 256.
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, :3] = torch.tensor([496.0, 272.0, 1.0])
    q, s = quantised(x, mx(hidden=32, scale_layout="row_major"))
    assert _bytes(s) == [127] and q[0, :3].float().tolist() == [448.0, 256.0, 1.0]
    # Denormal-range input: floor(log2) far below -127 clamps the exponent to -127, and the
    # values are scaled exactly (by 2^127).
    tiny = torch.full((1, 32), 2.0 ** -130, dtype=torch.bfloat16)
    q, s = quantised(tiny, mx(hidden=32, scale_layout="row_major"))
    assert _bytes(s) == [0] and set(q.float().flatten().tolist()) == {0.125}


@pytest.mark.parametrize("make", [mx, nv])
def test_make_inputs_and_the_bitwise_check(make):
    problem = make(num_tokens=200, hidden=512)
    kernel = MXFP8_KERNEL if problem.format == "mxfp8" else NVFP4_KERNEL
    tensors = make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = reference(tensors, problem)
    assert expected["scales"].shape == (256, 512 // problem.block // 4 * 4)
    # Inputs reach many scales, not only zeros or one exponent.
    assert len(set(_bytes(expected["scales"]))) > 20
    kernel.check(expected, expected, problem)
    wrong = dict(expected, q=expected["q"].view(torch.uint8).clone())
    wrong["q"][7, 3] ^= 1
    wrong["q"] = wrong["q"].view(expected["q"].dtype)
    with pytest.raises(VerificationError, match=r"q: 1 of .* bytes differ; first at \(7, 3\)"):
        kernel.check(wrong, expected, problem)


@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("make", [mx, nv])
def test_the_reference_is_capturable_in_a_cuda_graph(make, dtype, layout):
    # The bench times the reference inside a CUDA graph capture: no tensor from host data, no
    # CPU table, no read back (testkit.capturable).
    problem = make(num_tokens=130, hidden=256, dtype=dtype, scale_layout=layout)
    tensors = make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = run_on_meta(lambda on_meta: reference(on_meta, problem), tensors)
    assert {name: tuple(t.shape) for name, t in expected.items()} == {
        name: tuple(t.shape) for name, t in reference(tensors, problem).items()}


def test_e2m1_rounding_of_every_half_precision_value():
    # Every finite bf16 and fp16 value (the midpoints 0.25 ... 5 and their neighbours among
    # them) against the nearest e2m1 magnitude found by distance, ties to the even code.
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    y = torch.cat([bits.view(torch.bfloat16).float(), bits.view(torch.float16).float()])
    y = y[~y.isnan()]
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    distance = (y.abs().clamp(max=6).unsqueeze(-1) - values).abs()
    nearest = distance.min(dim=-1, keepdim=True).values
    # The even code among the nearest: codes 0..7 scored by being nearest, then by evenness.
    score = (distance == nearest) * 2 + (torch.arange(8) % 2 == 0)
    expected = score.argmax(dim=-1) + 8 * torch.signbit(y)
    assert torch.equal(_e2m1_codes(y), expected.to(torch.uint8))
