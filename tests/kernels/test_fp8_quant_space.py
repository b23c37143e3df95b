"""The FP8 group-quant kernels' declarations on the CPU: the reference's definition (the floor,
UE8M0's exact rounding up, saturation, NaN and infinity, the scales' layouts), the exact check,
the edge-case inputs, the spaces' valid and refused points with their reasons, the heuristic
defaults, the roofline cost, and the problems a model's quantization_config gives."""

import dataclasses

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.fp8_group_quant import (
    QUANT_KERNEL,
    SILU_QUANT_KERNEL,
    SPACE,
    FP8GroupQuantProblem,
    GroupQuantConfig,
    SiluAndMulFP8QuantProblem,
)
from cutetune.kernels.fp8_quant import (
    AMAX_FLOOR,
    E4M3_MAX,
    check_exact,
    empty_scales,
    quantize_reference,
    round_up_to_power_of_two,
    with_edge_groups,
)
from cutetune.kernels.registry import NotApplicableError, VerificationError
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW, RMSNormConfig
from cutetune.kernels.rmsnorm import reference as rmsnorm_reference
from cutetune.kernels.rmsnorm_fp8_quant import KERNEL as NORM_KERNEL
from cutetune.kernels.rmsnorm_fp8_quant import SPACE as NORM_SPACE
from cutetune.kernels.rmsnorm_fp8_quant import RMSNormFP8QuantProblem
from cutetune.spaces.hf_quant import ActivationQuant
from cutetune.spaces.models import PRESETS

H200 = DEVICE_SPECS["H200"]
KERNELS = (QUANT_KERNEL, SILU_QUANT_KERNEL, NORM_KERNEL)


def _quant(tokens=1, dtype="bfloat16", hidden=7168, group=128, column_major=True, ue8m0=False):
    return FP8GroupQuantProblem(num_tokens=tokens, dtype=dtype, hidden=hidden, group_size=group,
                                column_major_scales=column_major, ue8m0=ue8m0)


def _silu(tokens=1, intermediate=2048, group=128, column_major=False, ue8m0=False):
    return SiluAndMulFP8QuantProblem(num_tokens=tokens, dtype="bfloat16",
                                     intermediate=intermediate, group_size=group,
                                     column_major_scales=column_major, ue8m0=ue8m0)


def _norm(tokens=1, hidden=7168, fused_add=True, group=128, column_major=True, ue8m0=False):
    return RMSNormFP8QuantProblem(num_tokens=tokens, dtype="bfloat16", hidden=hidden, eps=1e-6,
                                  weight_bias=0.0, fused_add=fused_add, group_size=group,
                                  column_major_scales=column_major, ue8m0=ue8m0)


# ---------------------------------------------------------------------------------------------
# The reference


def test_the_reference_divides_in_fp64_with_the_bits_of_an_fp32_division():
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(64, 128, generator=generator) * torch.logspace(-30, 30, 64)[:, None]
    q, scales = quantize_reference(values, 128, ue8m0=False)
    amax = values.reshape(64, 1, 128).abs().amax(-1)
    assert torch.equal(scales, amax.clamp(min=AMAX_FLOOR) / E4M3_MAX)
    fp32_quotients = values.reshape(64, 1, 128) / scales.unsqueeze(-1)
    assert torch.equal(q, torch.clamp(fp32_quotients, -E4M3_MAX, E4M3_MAX).to(
        torch.float8_e4m3fn).float().reshape(64, 128))


def test_scale_is_the_floored_amax_over_448_and_saturates_nothing():
    values = torch.zeros(3, 128)
    values[0, 5] = -3.5  # amax 3.5
    values[1, :] = 1e-12  # below the floor
    q, scales = quantize_reference(values, 128, ue8m0=False)
    assert scales[:, 0].tolist() == pytest.approx(
        [3.5 / E4M3_MAX, AMAX_FLOOR / E4M3_MAX, AMAX_FLOOR / E4M3_MAX], rel=0)
    assert scales[0, 0] == torch.tensor(3.5) / torch.tensor(E4M3_MAX)  # fp32 division
    assert q[0, 5] == -E4M3_MAX and q[2].abs().max() == 0  # an all-zero group: zeros
    assert q[1, 0] == torch.tensor(1e-12 / (AMAX_FLOOR / E4M3_MAX)).to(
        torch.float8_e4m3fn).float()


def test_ue8m0_rounds_up_to_the_power_of_two_exactly():
    just_above = torch.nextafter(torch.tensor(2.0**-7), torch.tensor(1.0))
    scales = torch.stack([torch.tensor(2.0**-7), just_above, torch.tensor(0.75 * 2.0**-7),
                          torch.tensor(float("inf")), torch.tensor(AMAX_FLOOR / E4M3_MAX)])
    rounded = round_up_to_power_of_two(scales)
    assert rounded.tolist() == [2.0**-7, 2.0**-6, 2.0**-7, float("inf"), 2.0**-42]
    # exp2(ceil(log2 s)) in fp32 rounds the scale just above a power of two down onto it;
    # the reference does not (so no |v| / scale passes 448).
    assert torch.exp2(torch.ceil(torch.log2(just_above))) == 2.0**-7
    # The bits' rounding against frexp's: s = m 2^e, m in [0.5, 1), is 2^e unless m is 0.5.
    random = torch.exp2(torch.empty(100000).uniform_(-42, 100))
    mantissa, exponent = torch.frexp(random)
    by_frexp = torch.where(mantissa == 0.5, random, torch.ldexp(torch.ones_like(random),
                                                                 exponent))
    assert torch.equal(round_up_to_power_of_two(random), by_frexp)


def test_ue8m0_quotients_stay_within_448():
    values = torch.randn(64, 128) * torch.logspace(-3, 3, 64).unsqueeze(1)
    q, scales = quantize_reference(values, 128, ue8m0=True)
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all()
    groups = values.reshape(64, 1, 128) / scales.unsqueeze(-1)
    assert groups.abs().max() <= E4M3_MAX


def test_rounding_is_to_nearest_even():
    values = torch.tensor([[448.0, 1.0625, -0.78125, 1.5 * 2.0**-9, 2.0**-10] + [0.0] * 59])
    q, scales = quantize_reference(values, 64, ue8m0=False)
    assert scales.item() == 1.0
    assert q[0, :5].tolist() == [448.0, 1.0, -0.75, 2.0**-8, 0.0]


def test_a_quotient_just_past_448_saturates():
    # amax / (amax / 448) rounds above 448 in fp32 for about one group in twelve: torch's cast
    # alone would make it NaN.
    amax = torch.tensor([41.33510971069336])
    assert (amax / (amax / E4M3_MAX)).item() > E4M3_MAX
    q, _ = quantize_reference(torch.cat([amax, torch.zeros(63)]).unsqueeze(0), 64, False)
    assert q[0, 0] == E4M3_MAX


def test_nan_is_left_out_of_the_amax_and_infinity_makes_the_group_zero_and_nan():
    values = torch.zeros(2, 64)
    values[0, :3] = torch.tensor([float("nan"), -2.0, 1.0])
    values[1, :3] = torch.tensor([float("inf"), -2.0, 1.0])
    q, scales = quantize_reference(values, 64, ue8m0=False)
    assert scales[0, 0] == torch.tensor(2.0) / E4M3_MAX
    assert q[0, 0].isnan() and q[0, 1] == -E4M3_MAX
    assert scales[1, 0] == float("inf")
    assert q[1, 0].isnan() and q[1, 1] == 0 and torch.signbit(q[1, 1]) and q[1, 2] == 0


def test_check_is_exact_and_tells_nan_and_the_sign_of_zero():
    expected = {"q": torch.tensor([[1.0, float("nan"), 0.0]])}
    check_exact({"q": expected["q"].to(torch.float8_e4m3fn)}, expected, ("q",))
    # A NaN of either sign is the NaN expected: e4m3's 0xFF as well as 0x7F.
    negative_nan = torch.tensor([[0x38, 0xFF, 0x00]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert torch.signbit(negative_nan.float()[0, 1])
    check_exact({"q": negative_nan}, expected, ("q",))
    for wrong in ([[1.125, float("nan"), 0.0]], [[1.0, 2.0, 0.0]], [[1.0, float("nan"), -0.0]],
                  [[float("nan"), float("nan"), 0.0]]):
        with pytest.raises(VerificationError, match="q: 1 of 3 elements differ"):
            check_exact({"q": torch.tensor(wrong)}, expected, ("q",))


def test_column_major_scales_are_tma_padded():
    scales = empty_scales(5, 3, column_major=True, device="cpu")
    assert scales.shape == (5, 3) and scales.stride() == (1, 8)
    assert empty_scales(5, 3, column_major=False, device="cpu").stride() == (3, 1)


def test_edge_groups_reach_every_input():
    generator = torch.Generator().manual_seed(3)
    values = with_edge_groups(torch.randn(2, 640, generator=generator), 128, generator)
    groups = values.reshape(10, 128)
    assert any((g == 0).all() for g in groups)
    assert any((g.abs().max() < AMAX_FLOOR) & (g != 0).any() for g in groups)
    assert any((g.abs() == E4M3_MAX).any() for g in groups)
    assert any(torch.signbit(g).all() and (g == 0).all() for g in groups)


@pytest.mark.parametrize("kernel, problem", [
    (QUANT_KERNEL, _quant(tokens=5, hidden=512)),
    (QUANT_KERNEL, _quant(tokens=3, dtype="float16", hidden=256, group=64, column_major=False,
                          ue8m0=True)),
    (SILU_QUANT_KERNEL, _silu(tokens=4, intermediate=256, column_major=True)),
    (NORM_KERNEL, _norm(tokens=3, hidden=512)),
    (NORM_KERNEL, _norm(tokens=3, hidden=256, fused_add=False, group=64, column_major=False,
                        ue8m0=True)),
], ids=lambda v: getattr(v, "name", None) or v.describe())
def test_reference_is_the_unfused_chain_and_the_kernel_layout(kernel, problem):
    tensors = kernel.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = kernel.reference(tensors, problem)
    x = tensors["x"].float()
    if kernel is SILU_QUANT_KERNEL:
        gate, up = x.chunk(2, dim=1)
        x = (torch.nn.functional.silu(gate) * up).bfloat16().float()
    elif kernel is NORM_KERNEL:
        normed = rmsnorm_reference(tensors, problem.norm_problem(problem.fused_add))["out"]
        x = normed.bfloat16().float()
    q, scales = quantize_reference(x, problem.group_size, problem.ue8m0)
    torch.testing.assert_close(expected["q"], q, rtol=0, atol=0, equal_nan=True)
    kernel_scales = expected["scales"].t() if problem.column_major_scales else expected["scales"]
    torch.testing.assert_close(kernel_scales, scales, rtol=0, atol=0)
    # The inputs' scales buffer is in the kernel's layout: the transpose of column-major.
    assert tuple(tensors["scales"].shape) == tuple(expected["scales"].shape)
    kernel.check({**tensors, "q": q.to(torch.float8_e4m3fn), "scales": expected["scales"],
                  "residual": expected.get("residual")}, expected, problem)


# ---------------------------------------------------------------------------------------------
# Problems


@pytest.mark.parametrize("make, message", [
    (lambda: _quant(group=96), "group_size must be one of (64, 128), got 96"),
    (lambda: _quant(hidden=7200), "hidden must be a positive multiple of group_size 128"),
    (lambda: _quant(dtype="float32"), "dtype 'float32' not supported: use bfloat16, float16"),
    (lambda: _silu(intermediate=96, group=64), "intermediate must be a positive multiple"),
    (lambda: _quant(column_major=1), "column_major_scales must be a bool"),
    (lambda: _norm(hidden=32768), "hidden 32768 not supported: at most 16384"),
])
def test_problems_refuse_what_the_kernels_do_not_compute(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_deepseek_v3_gets_column_major_fp32_scales_in_groups_of_128():
    model = PRESETS["deepseek-v3"]
    quant = QUANT_KERNEL.problems_for_model(model, "bfloat16")
    # The hidden size, the attention output (128 heads x v_head_dim 128), the MLP widths.
    assert [p.hidden for p in quant] == [7168, 16384, 18432, 2048]
    assert {(p.group_size, p.column_major_scales, p.ue8m0) for p in quant} == {(128, True, False)}
    assert [p.intermediate for p in SILU_QUANT_KERNEL.problems_for_model(model, "bfloat16")] == [
        18432, 2048]
    norms = NORM_KERNEL.problems_for_model(model, "bfloat16")
    assert [(p.hidden, p.fused_add, p.eps) for p in norms] == [
        (7168, False, 1e-6), (7168, True, 1e-6), (1536, False, 1e-6), (512, False, 1e-6)]


def test_ue8m0_and_groups_of_64_come_from_the_config():
    model = dataclasses.replace(PRESETS["qwen3-8b"], name="q8",
                                activation_quant=ActivationQuant("fp8_group", 64, "ue8m0"))
    # The attention output (32 heads x 128) is the hidden size again: one problem.
    (problem, mlp) = QUANT_KERNEL.problems_for_model(model, "float16")
    assert (problem.hidden, mlp.hidden) == (4096, 12288)
    assert (problem.group_size, problem.ue8m0, problem.dtype) == (64, True, "float16")


@pytest.mark.parametrize("name, quant, message", [
    ("qwen3-8b", None, "model qwen3-8b has no activation quantisation"),
    ("llama-3.1-8b-fp4", "preset", "model llama-3.1-8b-fp4 has nvfp4 activations"),
    ("qwen3-8b", ActivationQuant("fp8_group", 32), "quantises its activations in groups of 32"),
])
def test_models_without_fp8_groups_are_not_applicable(name, quant, message):
    model = PRESETS[name]
    if isinstance(quant, ActivationQuant):
        model = dataclasses.replace(model, activation_quant=quant)
    for kernel in KERNELS:
        with pytest.raises(NotApplicableError, match=message):
            kernel.problems_for_model(model, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Spaces, defaults, cost


def test_group_space_refuses_with_reasons():
    problem = _quant(group=64)
    enumeration = SPACE.enumerate(problem, H200)
    assert {"group_splits_among_lanes", "loads_per_thread_unrollable"} <= set(
        enumeration.rejections_by_constraint())
    # 64 bf16 on 32 lanes of 128-bit vectors: a quarter vector each.
    assert SPACE.first_violation(problem, GroupQuantConfig(128, 32, 1, 4), H200).name == (
        "group_splits_among_lanes")
    # 2 groups x 8 vectors of 32 bits = 16 loads; 4 groups = 32.
    assert SPACE.first_violation(problem, GroupQuantConfig(32, 1, 4, 4), H200).name == (
        "loads_per_thread_unrollable")
    assert GroupQuantConfig(32, 32, 1, 4) in enumeration.valid
    assert GroupQuantConfig(32, 4, 2, 4) in enumeration.valid


def test_norm_space_keeps_a_group_within_a_warp():
    problem = _norm(hidden=4096)
    assert NORM_SPACE.first_violation(problem, RMSNormConfig(BLOCK_PER_ROW, 32, 4),
                                      H200).name == "group_within_a_warp"  # 128 / 2 = 64 lanes
    assert RMSNormConfig(BLOCK_PER_ROW, 64, 4) in NORM_SPACE.enumerate(problem, H200).valid


@pytest.mark.parametrize("kernel, problem", [
    (QUANT_KERNEL, _quant()), (QUANT_KERNEL, _quant(group=64, hidden=512)),
    (SILU_QUANT_KERNEL, _silu()), (NORM_KERNEL, _norm()),
    (NORM_KERNEL, _norm(hidden=512, fused_add=False)),
], ids=lambda v: getattr(v, "name", None) or v.describe())
@pytest.mark.parametrize("tokens", [1, 64, 4096, 32768])
def test_defaults_are_valid_at_every_size(kernel, problem, tokens):
    problem = problem.with_tokens(tokens)
    config = kernel.default_config(problem, H200)
    assert config in kernel.space.enumerate(problem, H200).valid


def test_cost_counts_each_byte_once():
    problem = _quant(tokens=10)
    config = QUANT_KERNEL.default_config(problem, H200)
    assert QUANT_KERNEL.cost(problem, config, H200).bytes_moved == 10 * 7168 * 3 + 10 * 56 * 4
    silu = _silu(tokens=10)
    assert SILU_QUANT_KERNEL.cost(silu, SILU_QUANT_KERNEL.default_config(silu, H200),
                                  H200).bytes_moved == 10 * 2048 * 5 + 10 * 16 * 4
    norm = _norm(tokens=10)
    assert NORM_KERNEL.cost(norm, NORM_KERNEL.default_config(norm, H200), H200).bytes_moved == (
        10 * 7168 * 7 + 7168 * 2 + 10 * 56 * 4)
    assert NORM_KERNEL.cost(norm, NORM_KERNEL.default_config(norm, H200), H200).blocks == 10


def test_a_problem_that_splits_among_no_lanes_has_wide_groups_only():
    # 64 fp16 elements = 128 bytes: one 128-bit vector on each of 8 lanes at most.
    problem = _quant(dtype="float16", group=64, hidden=64)
    lanes = {c.lanes_per_group for c in SPACE.enumerate(problem, H200).valid
             if c.vector_bits == 128}
    assert lanes == {1, 2, 4, 8}


def test_norm_forms_follow_the_row():
    assert NORM_KERNEL.default_config(_norm(hidden=512), H200).form == WARP_PER_ROW
    assert NORM_KERNEL.default_config(_norm(hidden=7168), H200).form == BLOCK_PER_ROW


def test_fused_check_allows_one_rounding_step_in_a_few_elements_only():
    from cutetune.kernels.fp8_quant import check_fused, e4m3_step

    assert e4m3_step(torch.tensor([448.0, 1.0, 0.9375, 2.0**-7, 0.0])).tolist() == [
        32.0, 0.125, 0.0625, 2.0**-9, 2.0**-9]
    q = torch.linspace(-400, 400, 1000).to(torch.float8_e4m3fn).float()
    scales = torch.rand(1, 50) + 0.5
    expected = {"q": q.clone(), "scales": scales.clone()}
    q[7] += e4m3_step(q[7:8])[0]
    scales[0, 3] *= 1 + 2.0**-8
    check_fused({"q": q, "scales": scales}, expected, "bfloat16")
    with pytest.raises(VerificationError, match="scales: 50 of 50 elements off by more"):
        check_fused({"q": q, "scales": scales * (1 + 2.0**-6)}, expected, "bfloat16")
    with pytest.raises(VerificationError, match="q: 1 of 1000 elements off by more"):
        check_fused({"q": q.index_fill(0, torch.tensor([9]), 1e4), "scales": scales}, expected,
                    "bfloat16")
    # A rounding mode off by one step everywhere is caught by the exact share.
    shifted = expected["q"] + e4m3_step(expected["q"])
    with pytest.raises(VerificationError, match="q: 1000 of 1000 elements differ from the "
                                                "reference by a rounding step; at most 10"):
        check_fused({"q": shifted, "scales": scales}, expected, "bfloat16")
    with pytest.raises(VerificationError, match="q: NaN at 1 elements"):
        check_fused({"q": q.index_fill(0, torch.tensor([2]), float("nan")), "scales": scales},
                    expected, "bfloat16")


def test_a_power_of_two_scale_divides_as_its_reciprocal_multiplies():
    """What lets the kernels multiply by a UE8M0 scale's reciprocal: for every power of two the
    floor allows up to the largest (and infinity), x / s and x * (1 / s) are the same fp32
    bits, subnormal quotients, zeros and NaN included."""
    x = torch.cat([torch.randn(4096) * torch.logspace(-40, 38, 4096),
                   torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-45, -3e-39])])
    scales = torch.cat([torch.exp2(torch.arange(-42.0, 128.0)), torch.tensor([float("inf")])])
    for scale in scales:
        torch.testing.assert_close(x * (1.0 / scale), x / scale, rtol=0, atol=0,
                                   equal_nan=True)
        assert torch.equal(torch.signbit(x * (1.0 / scale)), torch.signbit(x / scale))


@pytest.mark.parametrize("kernel, problem", [
    (QUANT_KERNEL, _quant(tokens=8, hidden=512, ue8m0=True)),
    (SILU_QUANT_KERNEL, _silu(tokens=8, intermediate=512)),
    (NORM_KERNEL, _norm(tokens=8, hidden=512, group=64)),
], ids=lambda v: getattr(v, "name", None) or v.describe())
def test_torch_compile_of_the_reference_passes_the_check(kernel, problem):
    """`cutetune bench` times torch.compile of the reference beside ours, checked by the
    kernel's check: Inductor computes a bf16 intermediate in fp32 (the fused add's sum, the
    activation, the normalised row) unless rounded_to keeps the rounding out of its graph, and
    its Triton code divides fp32 approximately unless the division is fp64's."""
    from cutetune.bench import torch_eager

    def inputs():
        return kernel.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))

    expected = kernel.reference(inputs(), problem)
    compiled = torch.compile(torch_eager(kernel, problem), dynamic=False)
    kernel.check(compiled(inputs()), expected, problem)
