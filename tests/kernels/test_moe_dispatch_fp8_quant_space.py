"""moe_dispatch_fp8_quant's declaration on the CPU: the problem (moe_dispatch's with the
quantisation's fields), the space's valid and refused points with their reasons (moe_dispatch's
constraints held by the routing kernel, the quantisation's own), the heuristic default, the
roofline cost, the reference (moe_dispatch's, then fp8_group_quant's of its rows), the check
(which fails on a wrong code, scale or padding row), the unfused chain, the model problems,
and that moe_dispatch's code hash is untouched by it."""

import dataclasses

import pytest
import torch

from cutetune import bench
from cutetune.bench import UNFUSED_NAME, candidates
from cutetune.build.compiled import CompiledPoints
from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.device.verify import check_outputs
from cutetune.kernels import moe_dispatch_fp8_quant as mq
from cutetune.kernels.code_hash import code_closure
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.fp8_group_quant import FP8GroupQuantProblem
from cutetune.kernels.fp8_quant import AMAX_FLOOR, E4M3_MAX, quantize_reference
from cutetune.kernels.moe_common import MoEProblem, reference_dispatch
from cutetune.kernels.moe_dispatch import KERNEL as DISPATCH_KERNEL
from cutetune.kernels.registry import NotApplicableError, VerificationError
from cutetune.serving.plan import ServingPlan
from cutetune.spaces.models import PRESETS
from testkit.reference_runner import reference_runner

H200 = DEVICE_SPECS["H200"]
KERNEL = mq.KERNEL
Config = mq.DispatchFP8QuantConfig


def _problem(tokens=1, dtype="bfloat16", hidden=7168, experts=256, top_k=8, pad=16, begin=0,
             end=None, zero_padding=False, group=128, column_major=True, ue8m0=False):
    return mq.MoEDispatchFP8QuantProblem(
        num_tokens=tokens, dtype=dtype, hidden=hidden, experts=experts, top_k=top_k, pad=pad,
        expert_begin=begin, expert_end=experts if end is None else end,
        zero_padding=zero_padding, group_size=group, column_major_scales=column_major,
        ue8m0=ue8m0)


def _rejections(problem, device=H200) -> dict:
    return {r.config: r.constraint for r in KERNEL.space.enumerate(problem, device).rejected}


# ---------------------------------------------------------------------------------------------
# The problem


def test_the_problem_is_moe_dispatchs_with_the_quantisations_fields():
    p = _problem(tokens=5, begin=64, end=128, zero_padding=True, group=64, ue8m0=True)
    assert p.dispatch == MoEProblem(num_tokens=5, dtype="bfloat16", hidden=7168, experts=256,
                                    top_k=8, pad=16, expert_begin=64, expert_end=128,
                                    zero_padding=True)
    assert p.capacity == p.dispatch.capacity == 5 * 8 + 64 * 15
    assert set(p.static_names()) == {*MoEProblem.static_names(), "group_size",
                                     "column_major_scales", "ue8m0"}


@pytest.mark.parametrize("make, message", [
    (lambda: _problem(hidden=7168 + 64), "hidden must be a positive multiple of group_size"),
    (lambda: _problem(group=32, hidden=4096), "group_size must be one of"),
    (lambda: _problem(dtype="float32"), "dtype 'float32' not supported"),
    (lambda: _problem(top_k=300), "top_k 300"),
])
def test_problems_refuse_what_the_kernel_does_not_compute(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ---------------------------------------------------------------------------------------------
# The space, the default, the cost


def test_the_routing_kernels_constraints_are_moe_dispatchs_split_ones():
    names = [c.name for c in KERNEL.space.constraints]
    assert {"tokens_per_block_within_tokens", "local_experts_fit_scan", "counters_fit_smem",
            "block_size_within_device", "cooperative_grid_fits"} <= set(names)
    # Held over the dispatch problem and split's point: the routing kernel is split's.
    config = Config(32, 8, 1, 8, "streaming")
    assert config.routing == DISPATCH_KERNEL.space.config_from_dict(
        {"form": "split", "grid_blocks": 32, "warps_per_block": 8, "tokens_per_block": 1,
         "cache_hints": "streaming"})
    small = dataclasses.replace(H200, sm_count=8, registers_per_sm=16384, max_blocks_per_sm=4)
    rejected = _rejections(_problem(tokens=64), small)
    assert rejected[Config(128, 8, 1, 8, "normal")] == "cooperative_grid_fits"
    assert Config(32, 1, 1, 8, "normal") not in rejected


def test_space_refuses_with_reasons():
    rejected = _rejections(_problem(tokens=4, group=64))
    # 64 bf16 are 8 vectors of 128 bits: 16 lanes would hold half a vector each.
    assert rejected[Config(8, 4, 1, 16, "normal")] == "group_splits_among_lanes"
    # 4 tokens x 4 vectors per lane (a group of 128 on 4 lanes) are 16 loads, within bounds.
    assert Config(8, 4, 4, 4, "normal") not in _rejections(_problem(tokens=4))
    rejected = _rejections(_problem(tokens=2))
    assert rejected[Config(8, 4, 4, 8, "normal")] == "tokens_per_block_within_tokens"
    with pytest.raises(ValueError, match="violates group_splits_among_lanes: a group must be"):
        KERNEL.space.check(_problem(tokens=4, group=64), Config(8, 4, 1, 16, "normal"), H200)


def test_loads_per_thread_are_unrollable(monkeypatch):
    monkeypatch.setattr(mq, "MAX_VECTORS_PER_THREAD", 8)
    problem = _problem(tokens=4)
    rejected = _rejections(problem)
    # 4 lanes hold 4 vectors each of a group of 128 bf16: 4 tokens are 16 loads.
    assert rejected[Config(8, 4, 4, 4, "normal")] == "loads_per_thread_unrollable"
    assert Config(8, 4, 2, 4, "normal") not in rejected


@pytest.mark.parametrize("problem", [_problem(), _problem(group=64, dtype="float16", ue8m0=True),
                                     _problem(experts=8, top_k=2, hidden=4096)],
                         ids=lambda p: p.describe())
@pytest.mark.parametrize("tokens", [1, 7, 64, 1024, 32768])
def test_defaults_are_valid_at_every_size(problem, tokens):
    problem = problem.with_tokens(tokens)
    config = KERNEL.default_config(problem, H200)
    assert config in KERNEL.space.enumerate(problem, H200).valid
    # fp8_group_quant's lanes: 32 bytes of the group each.
    assert config.lanes_per_group == problem.group_size * 2 // 32
    assert config.tokens_per_block == 1 and config.cache_hints == "streaming"


def test_default_grid_and_block_follow_moe_dispatchs_split_default():
    assert KERNEL.default_config(_problem(tokens=1), H200) == Config(8, 4, 1, 8, "streaming")
    assert KERNEL.default_config(_problem(tokens=4096), H200) == Config(
        32, 8, 1, 8, "streaming")


def test_cost_counts_each_byte_once():
    problem = _problem(tokens=10, experts=8, top_k=2, hidden=4096)
    config = KERNEL.default_config(problem, H200)
    c = KERNEL.cost(problem, config, H200)
    routing = 4 * 20 + 4 * 20 + 4 * (2 * 8 + 2)
    # x read once per token; each of the 20 local pairs' rows written as FP8 with 32 scales.
    assert c.bytes_moved == routing + 10 * 4096 * 2 + 20 * (4096 + 32 * 4)
    # |v|, the max, the product by the reciprocal and the conversion, once per token.
    assert c.flops == 4 * 10 * 4096
    assert (c.launches, c.grid_barriers) == (2, 1)
    # Units of one token times the row's 32 groups over a block's 16 slots of 8 lanes.
    assert c.blocks == 10 * 2 and c.threads_per_block == 128
    zeroed = dataclasses.replace(problem, zero_padding=True)
    padding_rows = 8 * 15 / 2  # every expert hit, 7.5 rows of padding each
    assert KERNEL.cost(zeroed, config, H200).bytes_moved == (
        c.bytes_moved + int(padding_rows * (4096 + 32 * 4)))


def test_zeroed_padding_gets_a_copy_block_per_local_expert_at_least():
    decode = _problem(tokens=1)
    config = KERNEL.default_config(decode, H200)
    # 56 groups over the 16 slots of 4 warps of 8-lane groups: 4 slices of one token.
    assert KERNEL.cost(decode, config, H200).blocks == 4
    zeroed = dataclasses.replace(decode, zero_padding=True)
    assert KERNEL.cost(zeroed, config, H200).blocks == 256
    # pad 1 has no padding rows: no zeroing, no extra blocks.
    assert KERNEL.cost(dataclasses.replace(zeroed, pad=1), config, H200).blocks == 4


def test_every_valid_point_is_resident_and_predictable_on_every_device():
    for device in DEVICE_SPECS.values():
        for tokens in (1, 64, 4096):
            p = _problem(tokens=tokens)
            for config in KERNEL.space.enumerate(p, device).valid:
                c = KERNEL.cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


# ---------------------------------------------------------------------------------------------
# The reference and the check


def _inputs(problem, seed=0):
    return dict(KERNEL.make_inputs(problem, "cpu", torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("problem", [
    _problem(tokens=6, experts=16, top_k=4, hidden=512),
    _problem(tokens=5, experts=16, top_k=4, hidden=512, begin=4, end=12, zero_padding=True,
             group=64, column_major=False, ue8m0=True),
], ids=lambda p: p.describe())
def test_reference_is_moe_dispatch_then_fp8_group_quant_of_its_rows(problem):
    t = _inputs(problem)
    expected = KERNEL.reference(t, problem)
    dispatched = reference_dispatch(t["x"], t["topk_ids"], problem.dispatch)
    q, scales = quantize_reference(dispatched["dispatched"].float(), problem.group_size,
                                   problem.ue8m0)
    for name in ("counts", "offsets", "row_of", "error"):
        assert torch.equal(expected[name], dispatched[name])
    assert torch.equal(expected["q"], q)
    layout = expected["scales"].t() if problem.column_major_scales else expected["scales"]
    assert torch.equal(layout, scales)
    # The rows no token fills are all-zero groups: zero codes with the floor's scale.
    empty = ~torch.isin(torch.arange(problem.capacity), dispatched["row_of"].flatten())
    assert empty.any() and bool((q[empty] == 0).all())
    floor = torch.tensor(AMAX_FLOOR / E4M3_MAX, dtype=torch.float32)
    if problem.ue8m0:
        floor = torch.tensor(2.0**-42)  # 2.2e-13 rounded up to a power of two
    assert bool((scales[empty] == floor).all())
    # make_inputs' outputs are the reference's shapes, the scales in the op's layout.
    assert t["q"].shape == q.shape and t["q"].dtype == torch.float8_e4m3fn
    assert t["scales"].shape == expected["scales"].shape


def _wrote_reference(problem, seed=1):
    """Inputs with the reference written into the outputs (in a row order of their own:
    swapped within an expert), and the reference."""
    t = _inputs(problem, seed)
    expected = KERNEL.reference(t, problem)
    for name in KERNEL.outputs:
        t[name].copy_(expected[name])
    return t, expected


@pytest.mark.parametrize("zero_padding", [False, True])
def test_the_check_takes_any_row_order_within_a_segment(zero_padding):
    problem = _problem(tokens=6, experts=4, top_k=2, hidden=256, zero_padding=zero_padding)
    t, expected = _wrote_reference(problem)
    # Swap the first two pairs of expert 0: their rows, q rows and scales together.
    rows = t["row_of"].flatten()
    a, b = (rows == 0).nonzero()[0], (rows == 1).nonzero()[0]
    rows[a], rows[b] = 1, 0
    scales = t["scales"].t()  # (rows, groups)
    t["q"][[0, 1]] = t["q"][[1, 0]].clone()
    scales[[0, 1]] = scales[[1, 0]].clone()
    check_outputs(KERNEL, problem, t, expected)


@pytest.mark.parametrize("spoil, message", [
    (lambda t: t["q"].view(torch.uint8)[0, 5].add_(1), "dispatched: some row does not hold"),
    (lambda t: t["scales"].t()[1, 0].mul_(2), "scales: 1 of"),
    (lambda t: t["row_of"].view(-1)[0].fill_(-1), "row_of: pair 0"),
    (lambda t: t["counts"][0].add_(1), "counts: got"),
])
def test_the_check_fails_on_a_wrong_output(spoil, message):
    problem = _problem(tokens=6, experts=4, top_k=2, hidden=256)
    t, expected = _wrote_reference(problem)
    spoil(t)
    with pytest.raises(VerificationError, match=message):
        check_outputs(KERNEL, problem, t, expected)


def test_the_check_judges_padding_rows_only_where_they_are_zeroed():
    problem = _problem(tokens=3, experts=4, top_k=2, hidden=256)
    t, expected = _wrote_reference(problem)
    used = int(expected["offsets"][-1])
    padding = ~torch.isin(torch.arange(used), t["row_of"].flatten())
    assert padding.any()
    (row,) = padding.nonzero()[0].tolist()
    t["q"][row].view(torch.uint8).fill_(0x7F)
    t["scales"].t()[row].fill_(float("nan"))
    check_outputs(KERNEL, problem, t, expected)  # left as they were: not judged
    zeroed = dataclasses.replace(problem, zero_padding=True)
    with pytest.raises(VerificationError, match="dispatched: padding rows are not zero"):
        check_outputs(KERNEL, zeroed, t, expected)
    t["q"][row].view(torch.uint8).fill_(0)
    with pytest.raises(VerificationError, match="padding scales"):
        check_outputs(KERNEL, zeroed, t, expected)


# ---------------------------------------------------------------------------------------------
# The unfused chain, the models, the code hash


def test_the_chain_is_moe_dispatch_then_fp8_group_quant_of_the_capacity():
    p = _problem(tokens=5, group=64, column_major=False, ue8m0=True, zero_padding=True)
    assert [(step.kernel, step.problem(p), dict(step.names), step.rounds)
            for step in KERNEL.unfused] == [
        ("moe_dispatch", p.dispatch, {}, False),
        ("fp8_group_quant", FP8GroupQuantProblem(
            num_tokens=p.capacity, dtype="bfloat16", hidden=7168, group_size=64,
            column_major_scales=False, ue8m0=True), {"x": "dispatched"}, False)]


@pytest.mark.parametrize("problem", [
    _problem(tokens=5, experts=16, top_k=4, hidden=512),
    _problem(tokens=3, experts=16, top_k=4, hidden=512, begin=4, end=12, zero_padding=True,
             group=64, column_major=False, ue8m0=True),
], ids=lambda p: p.describe())
def test_bench_runs_the_chain_into_the_fused_kernels_outputs(problem, monkeypatch):
    served = []
    monkeypatch.setattr(bench, "ours_runner", reference_runner(served))
    found = {c.name: c for c in candidates(KERNEL, problem, ServingPlan(H200), CompiledPoints())}
    chain = found[f"{UNFUSED_NAME}: moe_dispatch + fp8_group_quant"]
    assert [name for name, _ in served[-2:]] == ["moe_dispatch", "fp8_group_quant"]
    inputs = KERNEL.bench_inputs(problem, "cpu", torch.Generator().manual_seed(4))
    assert inputs["dispatched"].shape == (problem.capacity, problem.hidden)
    expected = KERNEL.reference(inputs, problem)
    given = KERNEL.bench_inputs(problem, "cpu", torch.Generator().manual_seed(4))
    outputs = chain.run(given)
    assert set(outputs) == set(KERNEL.outputs)
    check_outputs(KERNEL, problem, outputs, expected, roundings=chain.roundings)
    assert outputs["scales"].stride() == given["scales"].stride()


def test_deepseek_v3_gets_its_dispatch_with_column_major_scales_in_groups_of_128():
    (problem,) = KERNEL.problems_for_model(PRESETS["deepseek-v3"], "bfloat16")
    (dispatch,) = DISPATCH_KERNEL.problems_for_model(PRESETS["deepseek-v3"], "bfloat16")
    assert problem.dispatch == dispatch
    assert (problem.group_size, problem.column_major_scales, problem.ue8m0) == (128, True, False)


@pytest.mark.parametrize("name, message", [
    ("qwen3-30b-a3b", "has no activation quantisation"),
    ("qwen3-8b", "has no activation quantisation"),
])
def test_models_without_fp8_groups_are_not_applicable(name, message):
    with pytest.raises(NotApplicableError, match=message):
        KERNEL.problems_for_model(PRESETS[name], "bfloat16")


def test_moe_dispatchs_code_closure_holds_none_of_this_kernels_files():
    closure = {path.name for path in code_closure(*DISPATCH_KERNEL.device_files,
                                                  definitions=DISPATCH_KERNEL.schema_definitions)}
    assert "split_kernels.py" in closure
    assert not closure & {"fp8_quant_kernels.py", "moe_dispatch_fp8_quant.py", "fp8_quant.py"}
    ours = {path.name for path in code_closure(*KERNEL.device_files,
                                               definitions=KERNEL.schema_definitions)}
    # Ours follows the routing kernel and fp8_quant's device pieces it reuses.
    assert {"split_kernels.py", "device.py", "fp8_quant.py", "fp8_quant_kernels.py",
            "moe_dispatch_fp8_quant.py"} <= ours
    assert KERNEL.source_hash() != DISPATCH_KERNEL.source_hash()
