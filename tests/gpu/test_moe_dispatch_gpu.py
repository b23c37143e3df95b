"""moe_dispatch on the GPU: the covering points (every valid point under the `sweep` marker)
against moe_common's check (uniform and skewed
routing, padding zeroed or left alone, a local expert range, pad 1, 64-bit vectors; the split
forms' points for Mixtral's few experts, whose routing blocks publish their counts or leave
their ranks to the copy), the most pairs the replicated form ranks, the heuristic default and
split_block_ranks at prefill sizes,
expert ids outside [0, E), CUDA-graph replays (the grid barrier re-arms itself), the launch
path's residency check, and the public op.

Every config of a test shares one workspace, as the tuner's input sets do: the barrier word
and the split form's counters must stay consistent across forms and grid sizes."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from cutetune.device.specs import device_spec_for
from cutetune.device.verify import check_outputs, poison
from cutetune.kernels import moe_common as moe
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.moe_dispatch import common as mdc
from cutetune.kernels.moe_dispatch import launcher as mdl
from cutetune.ops.moe_dispatch import DispatchResult, moe_dispatch, moe_dispatch_buffers
from testkit.compiled_points import compile_all
from testkit.compiled_points import compiled as compiled_point
from testkit.covering_points import WHICH_POINTS, narrowed
from testkit.every_point import assert_every_point
from testkit.moe_dispatch_points import point

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
# Qwen3-30B-A3B's MoE layer: hidden 2048, 128 experts, top-8, segments padded to 16.
QWEN = moe.MoEProblem(num_tokens=1, dtype="bfloat16", hidden=2048, experts=128, top_k=8,
                      pad=16, expert_begin=0, expert_end=128)
# fp16, a hidden size only 64-bit vectors divide (and not a whole number of slices), a local
# range of 12 of 20 experts, no padding.
SYNTHETIC = moe.MoEProblem(num_tokens=1, dtype="float16", hidden=1004, experts=20, top_k=3,
                           pad=1, expert_begin=5, expert_end=17)
LOCAL = dataclasses.replace(QWEN, expert_begin=32, expert_end=96)
# Mixtral-8x7B's: 8 experts, top-2, hidden 4096. Few experts: split's routing grids of 8 and 32
# blocks publish their counts, 128 blocks add them with atomics (publishes_counts).
MIXTRAL = moe.MoEProblem(num_tokens=1, dtype="bfloat16", hidden=4096, experts=8, top_k=2,
                         pad=16, expert_begin=0, expert_end=8)


@functools.cache
def spec():
    return device_spec_for(torch.cuda.get_device_name())


def compiled(problem, config):
    return compiled_point(md.KERNEL, problem, config)


def points_of(which, problem, points):
    """`points` narrowed to their covering points unless `which` is "every", compiled."""
    points = narrowed(which, points)
    compile_all(md.KERNEL, problem, points)
    return points


def inputs(problem, seed: int, skewed: bool = False, workspace=None):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tensors = dict(md.make_inputs(problem, DEVICE, generator))
    if skewed:
        tensors["topk_ids"], _ = moe.make_routing(problem, DEVICE, generator, skewed=True)
    if workspace is not None:
        tensors["workspace"] = workspace
    return tensors


def run_and_check(problem, config, tensors) -> None:
    """Poison every output, launch, and judge with moe_common's check."""
    expected = md.reference(tensors, problem)
    for name in md.KERNEL.outputs:
        poison(tensors[name])
    md.launch(compiled(problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(md.KERNEL, problem, tensors, expected,
                  label=f"{problem.describe()} {config}: ")


def op_outputs(result: DispatchResult) -> dict:
    """The op's result as check_dispatch reads outputs."""
    return {"dispatched": result.dispatched, "counts": result.counts,
            "offsets": result.offsets, "row_of": result.row_of, "error": result.error}


def barrier_low_bits(workspace) -> int:
    return int(workspace[mdc.WS_BARRIER].item()) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# Every valid point


@pytest.mark.parametrize("zero_padding", [False, True], ids=["free-padding", "zero-padding"])
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("tokens", [1, 7, 64])
@pytest.mark.parametrize("which", WHICH_POINTS)
def test_every_valid_point_matches_reference(tokens, skewed, zero_padding, which):
    problem = dataclasses.replace(QWEN.with_tokens(tokens), zero_padding=zero_padding)
    points = points_of(which, problem, md.SPACE.valid_points(problem, spec()))
    assert {c.form for c in points} == {mdc.FUSED, mdc.REPLICATED, mdc.SPLIT, mdc.SPLIT_BULK}
    workspace = md.new_workspace(problem, DEVICE)
    assert_every_point(points, lambda i, config: run_and_check(
        problem, config, inputs(problem, seed=i, skewed=skewed, workspace=workspace)),
        problem.describe())
    assert barrier_low_bits(workspace) == 0


@pytest.mark.parametrize("which", WHICH_POINTS)
def test_every_split_point_of_few_experts(which):
    # Both count exchanges and both copy hints, on one workspace, with uniform and skewed
    # routing: a published call must leave the atomic exchange's epoch and counters as it
    # found them, and the reverse. (The forms without a routing kernel do not exchange counts;
    # QWEN's every-point tests cover them.)
    problem = dataclasses.replace(MIXTRAL.with_tokens(1000), zero_padding=True)
    points = points_of(which, problem, [c for c in md.SPACE.valid_points(problem, spec())
                                        if c.form in mdc.SPLIT_FORMS])
    assert {c.form for c in points} == set(mdc.SPLIT_FORMS)
    split = [c for c in points if c.form == mdc.SPLIT]
    assert {mdc.publishes_counts(problem.local_experts, c.grid_blocks) for c in split} == \
        {True, False}
    assert {c.cache_hints for c in split} == {"normal", "streaming"}
    workspace = md.new_workspace(problem, DEVICE)
    for skewed in (False, True):
        assert_every_point(points, lambda i, config, skewed=skewed: run_and_check(
            problem, config, inputs(problem, seed=i, skewed=skewed, workspace=workspace)),
            f"{problem.describe()}, skewed={skewed}")
    assert barrier_low_bits(workspace) == 0


@pytest.mark.parametrize("which", WHICH_POINTS)
def test_every_valid_point_of_a_synthetic_problem(which):
    problem = SYNTHETIC.with_tokens(7)
    points = points_of(which, problem, md.SPACE.valid_points(problem, spec()))
    assert mdc.vector_bits(problem) == 64
    assert mdc.SPLIT_BLOCK_RANKS in {c.form for c in points}
    workspace = md.new_workspace(problem, DEVICE)
    assert_every_point(points, lambda i, config: run_and_check(
        problem, config, inputs(problem, seed=i, workspace=workspace)), problem.describe())


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_replicated_form_at_its_most_pairs(skewed):
    # 128 tokens of top-8: 1024 pairs, 32 warp steps of ranking in every block; skewed
    # routing puts most lanes of a step on the same few experts.
    problem = dataclasses.replace(QWEN.with_tokens(128), zero_padding=True)
    for i, (blocks, warps) in enumerate(((32, 1), (128, 4), (128, 8))):
        config = point(mdc.REPLICATED, blocks, warps, 2)
        run_and_check(problem, config, inputs(problem, seed=i, skewed=skewed))


@pytest.mark.parametrize("tokens", [7, 64])
def test_local_expert_range(tokens):
    problem = dataclasses.replace(LOCAL.with_tokens(tokens), zero_padding=True)
    workspace = md.new_workspace(problem, DEVICE)
    configs = [point(policy, blocks, 4, 2)
               for policy in (mdc.FUSED, mdc.REPLICATED, mdc.SPLIT, mdc.SPLIT_BULK)
               for blocks in (32, 128)]
    for i, config in enumerate(configs + [md.default_config(problem, spec())]):
        tensors = inputs(problem, seed=i, workspace=workspace)
        run_and_check(problem, config, tensors)
        ids = tensors["topk_ids"]
        outside = (ids < 32) | (ids >= 96)
        assert outside.any() and not outside.all()
        assert bool((tensors["row_of"][outside] == -1).all())
        assert int(tensors["counts"].sum()) == int((~outside).sum())


# ---------------------------------------------------------------------------------------------
# Prefill sizes: the heuristic default


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("tokens", [1000, 4096, 32768])
def test_default_config_at_prefill_sizes(tokens, skewed):
    problem = QWEN.with_tokens(tokens)
    config = md.default_config(problem, spec())
    assert config.form == mdc.SPLIT
    run_and_check(problem, config, inputs(problem, seed=tokens, skewed=skewed))


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("tokens", [4096, 32768])
@pytest.mark.parametrize("which", WHICH_POINTS)
def test_split_block_ranks_at_prefill_sizes(tokens, skewed, which):
    # Mixtral's few experts, padding zeroed, every grid, tokens per block and warps the space
    # holds at these sizes, on one workspace (the table is rewritten whole by every call).
    problem = dataclasses.replace(MIXTRAL.with_tokens(tokens), zero_padding=True)
    points = points_of(which, problem, [c for c in md.SPACE.valid_points(problem, spec())
                                        if c.form == mdc.SPLIT_BLOCK_RANKS
                                        and c.cache_hints == "streaming"])
    assert {c.grid_blocks for c in points} == {8, 32}
    assert {c.tokens_per_block for c in points} == {1, 2, 3, 4}
    workspace = md.new_workspace(problem, DEVICE)
    assert_every_point(points, lambda i, config: run_and_check(
        problem, config, inputs(problem, seed=i, skewed=skewed, workspace=workspace)),
        f"{problem.describe()}, skewed={skewed}")


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_split_block_ranks_for_eight_experts_of_a_top_8_model(skewed):
    # The default for a range of 8 of Qwen3-30B-A3B's experts at 4096 tokens (2048 of 32768
    # pairs local: 4096 pairs per routing block), and the widest grid with 4 tokens per block.
    problem = dataclasses.replace(QWEN.with_tokens(4096), expert_end=8, zero_padding=True)
    default = md.default_config(problem, spec())
    assert default.form == mdc.SPLIT_BLOCK_RANKS
    workspace = md.new_workspace(problem, DEVICE)
    for i, config in enumerate((default, point(mdc.SPLIT_BLOCK_RANKS, 32, 8, 4, "streaming"))):
        run_and_check(problem, config, inputs(problem, seed=i, skewed=skewed,
                                              workspace=workspace))


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("tokens", [1000, 4097])
def test_split_bulk_at_prefill_sizes(tokens, skewed):
    # Every rows-per-block the space holds, a token count no block size divides, padding
    # zeroed, and DeepSeek-V3's 7168-wide rows (two per block at most).
    problem = dataclasses.replace(QWEN.with_tokens(tokens), zero_padding=True)
    deepseek = moe.MoEProblem(num_tokens=tokens, dtype="bfloat16", hidden=7168, experts=256,
                              top_k=8, pad=16, expert_begin=0, expert_end=256)
    cases = [(problem, rows) for rows in (1, 2, 4)] + [(deepseek, 2)]
    for i, (case, rows) in enumerate(cases):
        config = point(mdc.SPLIT_BULK, 128, 8, rows)
        md.SPACE.check(case, config, spec())
        run_and_check(case, config, inputs(case, seed=i, skewed=skewed))


# ---------------------------------------------------------------------------------------------
# Expert ids outside [0, E)

BAD_IDS = (-1, QWEN.experts, 2**31 - 1, -(2**31))  # also outside Mixtral's 8


@pytest.mark.parametrize(("base", "tokens", "policy", "blocks"), [
    (QWEN, 7, mdc.FUSED, 128), (QWEN, 7, mdc.REPLICATED, 128), (QWEN, 7, mdc.SPLIT, 128),
    (QWEN, 1000, mdc.SPLIT, 128), (QWEN, 1000, mdc.SPLIT_BULK, 128),
    (MIXTRAL, 1000, mdc.SPLIT, 8), (MIXTRAL, 1000, mdc.SPLIT_BULK, 32),
    (MIXTRAL, 1000, mdc.SPLIT_BLOCK_RANKS, 8), (MIXTRAL, 1000, mdc.SPLIT_BLOCK_RANKS, 32)])
def test_ids_outside_the_experts_are_skipped_and_flagged(base, tokens, policy, blocks):
    # Mixtral's publish their counts (or, split_block_ranks, leave them in the same table for
    # the copy): the flag travels in the table.
    problem = base.with_tokens(tokens)
    config = point(policy, blocks, 4, 1)
    assert mdc.publishes_counts(problem.local_experts, blocks) == (base is MIXTRAL)
    workspace = md.new_workspace(problem, DEVICE)
    tensors = inputs(problem, seed=1, workspace=workspace)
    for i, bad in enumerate(BAD_IDS):
        tensors["topk_ids"][i, i % problem.top_k] = bad
    # The reference skips them too (row -1) and expects the flag; every other pair must be
    # in place, in its own row, with its token.
    run_and_check(problem, config, tensors)
    assert int(tensors["error"].item()) == 1
    assert [int(tensors["row_of"][i, i % problem.top_k])
            for i in range(len(BAD_IDS))] == [-1] * len(BAD_IDS)
    # A clean call on the same buffers clears the flag.
    clean = inputs(problem, seed=2, workspace=workspace)
    run_and_check(problem, config, clean)
    assert int(clean["error"].item()) == 0


@pytest.mark.parametrize(("base", "blocks", "policy"), [
    (QWEN, 128, mdc.SPLIT), (MIXTRAL, 8, mdc.SPLIT), (MIXTRAL, 32, mdc.SPLIT),
    (MIXTRAL, 32, mdc.SPLIT_BLOCK_RANKS)])
def test_a_bad_id_only_the_last_routing_block_sees_is_flagged(base, blocks, policy):
    # Block 0 (of split's routing, or of split_block_ranks' copy) writes the flag: it must
    # learn of the last routing block's error through the exchange (the atomic error count for
    # QWEN, the table for Mixtral).
    problem = base.with_tokens(1000)
    config = point(policy, blocks, 8, 1)
    tensors = inputs(problem, seed=3)
    tensors["topk_ids"][-1, -1] = problem.experts
    run_and_check(problem, config, tensors)
    assert int(tensors["error"].item()) == 1
    assert int(tensors["row_of"][-1, -1]) == -1


def test_public_op_validate_raises_on_bad_ids():
    x = torch.randn(5, QWEN.hidden, device=DEVICE).bfloat16()
    ids = torch.randint(0, QWEN.experts, (5, QWEN.top_k), device=DEVICE, dtype=torch.int32)
    ids[2, 3] = QWEN.experts + 5
    result = moe_dispatch(x, ids, QWEN.experts)  # no validation: no sync, no error
    torch.cuda.synchronize()
    assert int(result.row_of[2, 3]) == -1
    with pytest.raises(ValueError, match=r"expert ids outside \[0, 128\)"):
        moe_dispatch(x, ids, QWEN.experts, validate=True)
    ids[2, 3] = 0
    moe_dispatch(x, ids, QWEN.experts, validate=True)


# ---------------------------------------------------------------------------------------------
# CUDA graphs


@pytest.mark.parametrize(("base", "policy", "tokens", "blocks"), [
    (QWEN, mdc.FUSED, 7, 128), (QWEN, mdc.REPLICATED, 7, 128), (QWEN, mdc.SPLIT, 300, 128),
    (QWEN, mdc.SPLIT_BULK, 300, 128), (MIXTRAL, mdc.SPLIT, 300, 8),
    (MIXTRAL, mdc.SPLIT_BLOCK_RANKS, 300, 8)])
def test_graph_replays_twice_and_the_barrier_rearms(base, policy, tokens, blocks):
    problem = dataclasses.replace(base.with_tokens(tokens), zero_padding=True)
    config = point(policy, blocks, 4, 1)
    atomic_exchange = policy in (mdc.SPLIT, mdc.SPLIT_BULK) and not mdc.publishes_counts(
        problem.local_experts, blocks)
    kernel = compiled(problem, config)
    tensors = inputs(problem, seed=0)
    workspace = tensors["workspace"]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        md.launch(kernel, tensors)  # outside the capture: the residency check, module load
    torch.cuda.synchronize()
    epoch = int(workspace[mdc.WS_EPOCH].item())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        md.launch(kernel, tensors)
    for replay in range(2):
        fresh = inputs(problem, seed=10 + replay, skewed=replay == 1)
        tensors["x"].copy_(fresh["x"])
        tensors["topk_ids"].copy_(fresh["topk_ids"])
        expected = md.reference(tensors, problem)
        for name in md.KERNEL.outputs:
            poison(tensors[name])
        graph.replay()
        torch.cuda.synchronize()
        check_outputs(md.KERNEL, problem, tensors, expected, label=f"replay {replay}: ")
        assert barrier_low_bits(workspace) == 0
    # The atomic exchange advances its epoch once per call (the published exchange and the
    # fused form do not use it).
    assert int(workspace[mdc.WS_EPOCH].item()) == epoch + (2 if atomic_exchange else 0)


@pytest.mark.parametrize("into_buffers", [False, True], ids=["allocating", "into_buffers"])
def test_public_op_in_a_cuda_graph(into_buffers):
    problem = QWEN.with_tokens(9)
    tensors = inputs(problem, seed=3)
    x, ids = tensors["x"], tensors["topk_ids"]
    out = moe_dispatch_buffers(x, ids, QWEN.experts) if into_buffers else None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_dispatch(x, ids, QWEN.experts, out=out)  # compile; make this stream's workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        result = moe_dispatch(x, ids, QWEN.experts, out=out)
    assert result is out or not into_buffers
    for replay in range(2):
        fresh = inputs(problem, seed=20 + replay)
        x.copy_(fresh["x"])
        ids.copy_(fresh["topk_ids"])
        expected = moe.reference_dispatch(x, ids, problem)
        graph.replay()
        torch.cuda.synchronize()
        moe.check_dispatch(op_outputs(result), expected, problem)


# ---------------------------------------------------------------------------------------------
# The launch path's residency check


def test_every_valid_point_fits_this_device():
    properties = torch.cuda.get_device_properties(DEVICE)
    for tokens in (1, 4096):
        problem = QWEN.with_tokens(tokens)
        for config in md.SPACE.valid_points(problem, spec()):
            cost = mdc.cooperative_cost(problem, config)
            mdl.check_cooperative_grid(cost.blocks, cost.threads_per_block,
                                      cost.registers_per_thread, cost.smem_per_block,
                                      properties)


def test_a_grid_the_device_cannot_hold_is_refused_before_launch():
    def must_not_launch(*args):
        raise AssertionError("launched a cooperative grid the device cannot hold")

    config = point(mdc.FUSED, 100_000, 1, 1)  # outside the space
    kernel = mdl.CompiledDispatch(QWEN, config, must_not_launch)
    with pytest.raises(mdl.CooperativeGridError, match="cooperative grid of 100000 blocks"):
        md.launch(kernel, inputs(QWEN, seed=0))


# ---------------------------------------------------------------------------------------------
# The public op


@pytest.mark.parametrize(("tokens", "pad", "expert_range", "dtype", "zero_padding"), [
    (1, 16, None, torch.bfloat16, False),
    (1, 16, None, torch.bfloat16, True),
    (7, 1, None, torch.float16, False),
    (300, 16, (32, 96), torch.bfloat16, True),
    (4096, 8, (0, 64), torch.bfloat16, False),
])
def test_public_op_matches_reference(tokens, pad, expert_range, dtype, zero_padding):
    begin, end = expert_range or (0, QWEN.experts)
    dtype_name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    problem = dataclasses.replace(QWEN, num_tokens=tokens, pad=pad, expert_begin=begin,
                                  expert_end=end, dtype=dtype_name, zero_padding=zero_padding)
    tensors = inputs(problem, seed=tokens)
    result = moe_dispatch(tensors["x"], tensors["topk_ids"], QWEN.experts, pad=pad,
                             expert_range=expert_range, validate=True,
                             zero_padding=zero_padding)
    assert result.dispatched.shape == (problem.capacity, QWEN.hidden)
    assert result.dispatched.dtype is dtype
    expected = moe.reference_dispatch(tensors["x"], tensors["topk_ids"], problem)
    moe.check_dispatch(op_outputs(result), expected, problem)
    out = moe_dispatch_buffers(tensors["x"], tensors["topk_ids"], QWEN.experts, pad=pad,
                               expert_range=expert_range)
    for name in md.KERNEL.outputs:
        poison(getattr(out, name))
    assert moe_dispatch(tensors["x"], tensors["topk_ids"], QWEN.experts, pad=pad,
                        expert_range=expert_range, validate=True, zero_padding=zero_padding,
                        out=out) is out
    moe.check_dispatch(op_outputs(out), expected, problem)


def test_public_op_with_no_tokens():
    x = torch.empty(0, QWEN.hidden, device=DEVICE, dtype=torch.bfloat16)
    ids = torch.empty(0, QWEN.top_k, device=DEVICE, dtype=torch.int32)
    result = moe_dispatch(x, ids, QWEN.experts, pad=4, expert_range=(8, 24))
    assert result.row_of.shape == (0, QWEN.top_k)
    assert result.dispatched.shape == (16 * 3, QWEN.hidden)
    assert result.counts.tolist() == [0] * 16
    assert result.offsets.tolist() == [0] * 17


def test_public_op_rejects_mismatched_devices():
    x = torch.randn(2, 64, device=DEVICE).bfloat16()
    ids = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_ids is on cpu but x is on cuda"):
        moe_dispatch(x, ids, 8)
