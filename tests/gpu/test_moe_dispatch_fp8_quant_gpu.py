"""moe_dispatch_fp8_quant on the GPU: the covering points (every valid point under the `sweep`
marker) against its check (the layout exactly, every pair's row's e4m3 codes and scales bit for
bit against moe_dispatch's reference then fp8_group_quant's) on DeepSeek-V3's problem and a
synthetic one (fp16, groups of 64, row-major UE8M0 scales, a local expert range), with uniform
and skewed routing, padding zeroed (zero codes, an all-zero group's scale) or left alone, inputs
with edge-case groups (all zeros, below the floor, ties, saturation); the heuristic default at
prefill sizes; expert ids outside [0, E); CUDA-graph replays sharing a workspace with
moe_dispatch; the public op, also against moe_dispatch followed by fp8_group_quant.

Every config of a test shares one workspace, as the tuner's input sets do."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from cutetune.device.specs import device_spec_for
from cutetune.device.verify import check_outputs, poison
from cutetune.kernels import moe_common as moe
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels import moe_dispatch_fp8_quant as mq
from cutetune.kernels.fp8_quant import AMAX_FLOOR, E4M3_MAX
from cutetune.ops.fp8_quant import fp8_group_quant
from cutetune.ops.moe_dispatch import moe_dispatch
from cutetune.ops.moe_dispatch_fp8_quant import (
    moe_dispatch_fp8_quant,
    moe_dispatch_fp8_quant_buffers,
)
from testkit.compiled_points import compile_all
from testkit.compiled_points import compiled as compiled_point
from testkit.covering_points import WHICH_POINTS, narrowed
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
KERNEL = mq.KERNEL
Config = mq.DispatchFP8QuantConfig
# DeepSeek-V3's MoE layer: hidden 7168 (56 groups of 128), 256 experts, top-8, pad 16,
# column-major fp32 scales.
DEEPSEEK = mq.MoEDispatchFP8QuantProblem(
    num_tokens=1, dtype="bfloat16", hidden=7168, experts=256, top_k=8, pad=16, expert_begin=0,
    expert_end=256, group_size=128, column_major_scales=True, ue8m0=False)
# fp16, groups of 64 (a row of 24: not a whole number of slices of most blocks), row-major UE8M0
# scales, 12 local experts of 20, top-3.
SYNTHETIC = mq.MoEDispatchFP8QuantProblem(
    num_tokens=1, dtype="float16", hidden=1536, experts=20, top_k=3, pad=8, expert_begin=5,
    expert_end=17, group_size=64, column_major_scales=False, ue8m0=True)


@functools.cache
def spec():
    return device_spec_for(torch.cuda.get_device_name())


def points_of(which, problem, points):
    points = narrowed(which, points)
    compile_all(KERNEL, problem, points)
    return points


def inputs(problem, seed: int, skewed: bool = False, workspace=None):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tensors = dict(KERNEL.make_inputs(problem, DEVICE, generator))
    if skewed:
        tensors["topk_ids"], _ = moe.make_routing(problem, DEVICE, generator, skewed=True)
    if workspace is not None:
        tensors["workspace"] = workspace
    return tensors


def run_and_check(problem, config, tensors) -> None:
    """Poison every output, launch, and judge with the kernel's check."""
    expected = KERNEL.reference(tensors, problem)
    for name in KERNEL.outputs:
        poison(tensors[name])
    KERNEL.launch(compiled_point(KERNEL, problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected,
                  label=f"{problem.describe()} {config}: ")


# ---------------------------------------------------------------------------------------------
# Every valid point


@pytest.mark.parametrize("zero_padding", [False, True], ids=["free-padding", "zero-padding"])
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("base, tokens", [(DEEPSEEK, 1), (DEEPSEEK, 7), (DEEPSEEK, 64),
                                          (SYNTHETIC, 5), (SYNTHETIC, 300)],
                         ids=["deepseek-1", "deepseek-7", "deepseek-64", "synthetic-5",
                              "synthetic-300"])
@pytest.mark.parametrize("which", WHICH_POINTS)
def test_every_valid_point_matches_reference(base, tokens, skewed, zero_padding, which):
    problem = dataclasses.replace(base.with_tokens(tokens), zero_padding=zero_padding)
    points = points_of(which, problem, KERNEL.space.valid_points(problem, spec()))
    workspace = md.new_workspace(problem, DEVICE)
    assert_every_point(points, lambda i, config: run_and_check(
        problem, config, inputs(problem, seed=i, skewed=skewed, workspace=workspace)),
        problem.describe())


@pytest.mark.parametrize("tokens", [1, 128, 4096, 16384])
def test_default_config_at_every_size(tokens):
    problem = DEEPSEEK.with_tokens(tokens)
    config = KERNEL.default_config(problem, spec())
    run_and_check(problem, config, inputs(problem, seed=tokens))


def test_rows_of_all_zero_groups_get_zero_codes_and_the_floors_scale():
    problem = DEEPSEEK.with_tokens(9)
    tensors = inputs(problem, seed=5)
    tensors["x"][3].zero_()
    tensors["x"][4, :128] = 1e-12  # below the floor: scale 1e-10 / 448, codes of 0
    config = KERNEL.default_config(problem, spec())
    run_and_check(problem, config, tensors)
    rows = tensors["row_of"][3][tensors["row_of"][3] >= 0].long()
    assert bool((tensors["q"][rows].view(torch.uint8) == 0).all())
    # As the reference takes it (an fp32 division by 448 on the GPU is a multiplication by
    # its reciprocal in torch, one ulp off).
    floor = (torch.tensor(AMAX_FLOOR).double() / E4M3_MAX).float().to(DEVICE)
    assert bool((tensors["scales"][:, rows] == floor).all())


# ---------------------------------------------------------------------------------------------
# Expert ids outside [0, E)

BAD_IDS = (-1, DEEPSEEK.experts, 2**31 - 1, -(2**31))


@pytest.mark.parametrize("tokens, blocks", [(7, 8), (1000, 8), (1000, 128)])
def test_ids_outside_the_experts_are_skipped_and_flagged(tokens, blocks):
    problem = DEEPSEEK.with_tokens(tokens)
    config = Config(blocks, 4, 1, 8, "normal")
    workspace = md.new_workspace(problem, DEVICE)
    tensors = inputs(problem, seed=1, workspace=workspace)
    for i, bad in enumerate(BAD_IDS):
        tensors["topk_ids"][i, i % problem.top_k] = bad
    run_and_check(problem, config, tensors)
    assert int(tensors["error"].item()) == 1
    assert [int(tensors["row_of"][i, i % problem.top_k])
            for i in range(len(BAD_IDS))] == [-1] * len(BAD_IDS)
    clean = inputs(problem, seed=2, workspace=workspace)
    run_and_check(problem, config, clean)
    assert int(clean["error"].item()) == 0


def test_public_op_validate_raises_on_bad_ids():
    x = torch.randn(5, DEEPSEEK.hidden, device=DEVICE).bfloat16()
    ids = torch.randint(0, DEEPSEEK.experts, (5, 8), device=DEVICE, dtype=torch.int32)
    ids[2, 3] = DEEPSEEK.experts + 5
    result = moe_dispatch_fp8_quant(x, ids, DEEPSEEK.experts)
    torch.cuda.synchronize()
    assert int(result.row_of[2, 3]) == -1
    with pytest.raises(ValueError, match=r"expert ids outside \[0, 256\)"):
        moe_dispatch_fp8_quant(x, ids, DEEPSEEK.experts, validate=True)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, and the workspace moe_dispatch shares


def test_graph_replays_with_moe_dispatch_on_one_workspace():
    """Both kernels on one workspace, as the ops keep one per device and stream: split's
    atomic exchange (128 routing blocks of DeepSeek-V3's 256 experts) leaves its epoch and
    counters right for the other."""
    problem = DEEPSEEK.with_tokens(600)
    dispatch_problem = problem.dispatch
    config = Config(128, 8, 1, 8, "streaming")
    dispatch_config = md.SPACE.config_from_dict(
        {"form": "split", "grid_blocks": 128, "warps_per_block": 8, "tokens_per_block": 1,
         "cache_hints": "normal"})
    kernel = compiled_point(KERNEL, problem, config)
    dispatch = compiled_point(md.KERNEL, dispatch_problem, dispatch_config)
    workspace = md.new_workspace(problem, DEVICE)
    tensors = inputs(problem, seed=4, workspace=workspace)
    dispatch_tensors = dict(md.make_inputs(dispatch_problem, DEVICE,
                                           torch.Generator(device=DEVICE).manual_seed(5)))
    dispatch_tensors.update(x=tensors["x"], topk_ids=tensors["topk_ids"], workspace=workspace)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        KERNEL.launch(kernel, tensors)  # outside the capture: the residency check, module load
        md.launch(dispatch, dispatch_tensors)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        KERNEL.launch(kernel, tensors)
        md.launch(dispatch, dispatch_tensors)
    for replay in range(3):
        fresh = inputs(problem, seed=30 + replay)
        tensors["x"].copy_(fresh["x"])
        tensors["topk_ids"].copy_(fresh["topk_ids"])
        expected = KERNEL.reference(tensors, problem)
        graph.replay()
        torch.cuda.synchronize()
        check_outputs(KERNEL, problem, tensors, expected, label=f"replay {replay}: ")
        check_outputs(md.KERNEL, dispatch_problem, dispatch_tensors,
                      md.reference(dispatch_tensors, dispatch_problem),
                      label=f"moe_dispatch replay {replay}: ")


# ---------------------------------------------------------------------------------------------
# The public op


def _op_outputs(result, problem) -> dict:
    return {"q": result.q, "scales": result.scales.t() if problem.column_major_scales
            else result.scales, "counts": result.counts, "offsets": result.offsets,
            "row_of": result.row_of, "error": result.error}


@pytest.mark.parametrize(("base", "tokens", "expert_range", "zero_padding"), [
    (DEEPSEEK, 1, None, False),
    (DEEPSEEK, 33, (64, 128), True),
    (DEEPSEEK, 4096, None, False),
    (SYNTHETIC, 7, (5, 17), True),
])
def test_public_op_matches_reference_and_the_unfused_ops(base, tokens, expert_range,
                                                         zero_padding):
    begin, end = expert_range or (0, base.experts)
    problem = dataclasses.replace(base, num_tokens=tokens, expert_begin=begin, expert_end=end,
                                  zero_padding=zero_padding)
    tensors = inputs(problem, seed=tokens)
    x, ids = tensors["x"], tensors["topk_ids"]
    quant = {"group_size": problem.group_size,
             "column_major_scales": problem.column_major_scales, "ue8m0": problem.ue8m0}
    call = {"pad": problem.pad, "expert_range": expert_range, "zero_padding": zero_padding}
    result = moe_dispatch_fp8_quant(x, ids, problem.experts, validate=True, **call, **quant)
    expected = KERNEL.reference(tensors, problem)
    KERNEL.check(_op_outputs(result, problem), expected, problem)
    # moe_dispatch then fp8_group_quant of its rows: the same bytes on every row written.
    dispatched = moe_dispatch(x, ids, problem.experts, **call)
    q, scales = fp8_group_quant(dispatched.dispatched, **quant)
    chain = {"q": q, "scales": scales.t() if problem.column_major_scales else scales,
             "counts": dispatched.counts, "offsets": dispatched.offsets,
             "row_of": dispatched.row_of, "error": dispatched.error}
    KERNEL.check(_op_outputs(result, problem), chain, problem)
    out = moe_dispatch_fp8_quant_buffers(x, ids, problem.experts, pad=problem.pad,
                                         expert_range=expert_range,
                                         group_size=problem.group_size,
                                         column_major_scales=problem.column_major_scales)
    for name in KERNEL.outputs:
        poison(getattr(out, name))
    assert moe_dispatch_fp8_quant(x, ids, problem.experts, **call, **quant, out=out) is out
    KERNEL.check(_op_outputs(out, problem), expected, problem)


@pytest.mark.parametrize("into_buffers", [False, True], ids=["allocating", "into_buffers"])
def test_public_op_in_a_cuda_graph(into_buffers):
    problem = DEEPSEEK.with_tokens(9)
    tensors = inputs(problem, seed=3)
    x, ids = tensors["x"], tensors["topk_ids"]
    quant = {"column_major_scales": True}
    out = (moe_dispatch_fp8_quant_buffers(x, ids, problem.experts, **quant) if into_buffers
           else None)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_dispatch_fp8_quant(x, ids, problem.experts, **quant, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        result = moe_dispatch_fp8_quant(x, ids, problem.experts, **quant, out=out)
    for replay in range(2):
        fresh = inputs(problem, seed=20 + replay)
        x.copy_(fresh["x"])
        ids.copy_(fresh["topk_ids"])
        expected = KERNEL.reference({"x": x, "topk_ids": ids}, problem)
        graph.replay()
        torch.cuda.synchronize()
        KERNEL.check(_op_outputs(result, problem), expected, problem)


def test_public_op_with_no_tokens():
    x = torch.empty(0, DEEPSEEK.hidden, device=DEVICE, dtype=torch.bfloat16)
    ids = torch.empty(0, 8, device=DEVICE, dtype=torch.int32)
    result = moe_dispatch_fp8_quant(x, ids, DEEPSEEK.experts, pad=4, expert_range=(8, 24))
    assert result.q.shape == (16 * 3, DEEPSEEK.hidden)
    assert result.scales.shape == (16 * 3, 56)
    assert result.counts.tolist() == [0] * 16
