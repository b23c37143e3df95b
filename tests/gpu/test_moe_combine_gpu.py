"""moe_combine on the GPU: the covering points (every valid point under the `sweep` marker)
against the fp32 reference on uniform and skewed
routing at dynamic token counts, the default at 32768 tokens, a local expert range (pairs of
row -1), rows outside the capacity skipped without a fault, combine of identity experts, row
offsets past 2^31 elements, and the public op."""

from __future__ import annotations

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, compare, verify
from cutetune.kernels import moe_common
from cutetune.kernels.dtypes import FLOAT_TOLERANCE, TORCH_DTYPES
from cutetune.kernels.moe_combine import KERNEL, CombineConfig
from cutetune.kernels.moe_common import MoEProblem
from cutetune.ops.moe_combine import moe_combine
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
CUDA = torch.device("cuda")
TOKENS = (1, 7, 64, 1000, 4096)


def _problem(dtype="bfloat16", hidden=2048, experts=128, top_k=8, tokens=1, begin=0,
             end=None) -> MoEProblem:
    return MoEProblem(num_tokens=tokens, dtype=dtype, hidden=hidden, experts=experts,
                      top_k=top_k, pad=moe_common.DEFAULT_PAD, expert_begin=begin,
                      expert_end=experts if end is None else end)


PROBLEMS = [
    _problem(hidden=2048, experts=128, top_k=8),   # Qwen3-30B-A3B
    _problem(hidden=4096, experts=128, top_k=8),   # Qwen3-235B-A22B
    _problem(hidden=7168, experts=256, top_k=8),   # DeepSeek-V3: ragged passes
    _problem(hidden=4096, experts=8, top_k=2),     # Mixtral-8x7B
    _problem("float16", hidden=1002, experts=60, top_k=4),  # 32-bit vectors only
    _problem("float16", hidden=1004, experts=16, top_k=6),  # 64-bit vectors
]


def _compiled(problem: MoEProblem, config: CombineConfig):
    return compiled(KERNEL, problem, config)


def _points(which: str, problem: MoEProblem) -> list[CombineConfig]:
    points = selected_points(which, KERNEL, problem, H200)
    assert points
    compile_all(KERNEL, problem, points)
    return points


def _inputs(problem: MoEProblem, seed: int, skewed: bool = False) -> dict[str, torch.Tensor]:
    """Routing laid out as dispatch lays it; every expert row no pair refers to (padding,
    unused capacity) is NaN, so a kernel that reads one fails; out poisoned with NaN."""
    g = torch.Generator(CUDA).manual_seed(seed)
    ids, weights = moe_common.make_routing(problem, CUDA, g, skewed)
    row_of = moe_common.reference_layout(ids, problem)["row_of"]
    dtype = TORCH_DTYPES[problem.dtype]
    expert_out = torch.randn(problem.capacity, problem.hidden, generator=g, device=CUDA).to(dtype)
    used = torch.zeros(problem.capacity, dtype=torch.bool, device=CUDA)
    used[row_of[row_of >= 0].long()] = True
    expert_out[~used] = float("nan")
    out = torch.full((problem.num_tokens, problem.hidden), float("nan"), dtype=dtype,
                     device=CUDA)
    return {"expert_out": expert_out, "row_of": row_of, "topk_weights": weights, "out": out}


def _check(compiled, problem: MoEProblem, tensors, label: str = "") -> None:
    expected = KERNEL.reference(tensors, problem)
    KERNEL.launch(compiled, tensors)
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected, label=label)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.describe())
def test_points_match_reference(problem, which):
    points = _points(which, problem)

    def check(i, config):
        compiled = _compiled(problem, config)
        for tokens in TOKENS:
            sized = problem.with_tokens(tokens)
            # make_inputs' uniform routing through the tuner's verifier, then skewed routing
            # with NaN in every row no pair refers to.
            verify(KERNEL, sized, compiled, CUDA, seed=1000 * i + tokens)
            _check(compiled, sized, _inputs(sized, seed=tokens, skewed=True),
                   f"tokens={tokens} ")

    assert_every_point(points, check, problem.describe())


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.describe())
def test_default_at_32768_tokens(problem):
    sized = problem.with_tokens(32768)
    config = KERNEL.default_config(sized, H200)
    compiled = _compiled(sized, config)
    verify(KERNEL, sized, compiled, CUDA, seed=32768)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_local_expert_range_skips_other_experts_pairs(skewed, which):
    """Experts [32, 64) of 128 are local: about three quarters of the pairs are -1 (under
    skewed routing the hot experts 0-3 are remote, and some tokens have no local pair at
    all: their row must come out zero)."""
    problem = _problem(hidden=2048, experts=128, top_k=8, begin=32, end=64)

    def check(_, config):
        compiled = _compiled(problem, config)
        for tokens in (1, 7, 64, 1000):
            sized = problem.with_tokens(tokens)
            tensors = _inputs(sized, seed=tokens, skewed=skewed)
            assert bool((tensors["row_of"] < 0).any())
            _check(compiled, sized, tensors, f"tokens={tokens} ")

    assert_every_point(_points(which, problem), check, problem.describe())


def _corrupt(tensors: dict[str, torch.Tensor], capacity: int) -> torch.Tensor:
    """Replace some pairs' rows by values outside [0, capacity) other than -1; return row_of
    as the reference must see it (those pairs -1)."""
    row_of = tensors["row_of"]
    bad = torch.tensor([capacity, capacity + 1, capacity + 4096, 2**31 - 1, -2, -(2**31)],
                       dtype=torch.int32, device=CUDA)
    flat = row_of.view(-1)
    positions = torch.arange(0, flat.numel(), 3, device=CUDA)
    flat[positions] = bad[torch.arange(positions.numel(), device=CUDA) % bad.numel()]
    return torch.where((row_of >= 0) & (row_of < capacity), row_of, -1)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", [PROBLEMS[0], PROBLEMS[4]], ids=lambda p: p.describe())
def test_rows_outside_the_capacity_are_skipped_without_a_fault(problem, which):
    """Every third pair points past the capacity (just past it, far past it, at 2^31 - 1) or
    below -1. expert_out is a view into a larger buffer whose rows past the capacity are NaN,
    so a kernel that reads row `capacity` fails instead of faulting."""

    def check(_, config):
        compiled = _compiled(problem, config)
        for tokens in (1, 64, 1000):
            sized = problem.with_tokens(tokens)
            tensors = _inputs(sized, seed=tokens)
            buffer = torch.full((sized.capacity + 8192, sized.hidden), float("nan"),
                                dtype=tensors["expert_out"].dtype, device=CUDA)
            buffer[: sized.capacity] = tensors["expert_out"]
            tensors["expert_out"] = buffer[: sized.capacity]
            sane = _corrupt(tensors, sized.capacity)
            expected = moe_common.reference_combine(tensors["expert_out"], sane,
                                                    tensors["topk_weights"])
            KERNEL.launch(compiled, tensors)
            torch.cuda.synchronize()
            compare(f"tokens={tokens} out", tensors["out"], expected,
                    *FLOAT_TOLERANCE[sized.dtype])

    assert_every_point(_points(which, problem), check,
                       f"{problem.describe()} with rows outside the capacity")


def _identity_case(problem: MoEProblem, seed: int):
    g = torch.Generator(CUDA).manual_seed(seed)
    ids, weights = moe_common.make_routing(problem, CUDA, g)
    x = torch.randn(problem.num_tokens, problem.hidden, generator=g, device=CUDA).to(
        TORCH_DTYPES[problem.dtype])
    dispatched = moe_common.reference_dispatch(x, ids, problem)
    # Every expert the identity: combine gives back each token scaled by its weights' sum.
    expected = x.float() * weights.sum(1, keepdim=True)
    return dispatched, weights, expected


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", [PROBLEMS[0], PROBLEMS[3], PROBLEMS[5]],
                         ids=lambda p: p.describe())
def test_combine_of_identity_experts_is_the_weighted_token(problem, which):
    sized = problem.with_tokens(37)
    dispatched, weights, expected = _identity_case(sized, seed=37)

    def check(_, config):
        tensors = {"expert_out": dispatched["dispatched"], "row_of": dispatched["row_of"],
                   "topk_weights": weights,
                   "out": torch.full_like(expected, float("nan"),
                                          dtype=dispatched["dispatched"].dtype)}
        KERNEL.launch(_compiled(sized, config), tensors)
        torch.cuda.synchronize()
        compare("out", tensors["out"], expected, *FLOAT_TOLERANCE[sized.dtype])

    assert_every_point(_points(which, sized), check, f"{sized.describe()} with identity experts")


def test_row_offsets_past_2_to_the_31_elements():
    """DeepSeek-V3's hidden size with 300000 expert rows: 2.15e9 elements (4.3 GB). Pairs
    point at rows past 2^31 / 7168 = 299593, whose offsets a 32-bit index would wrap."""
    problem = _problem(hidden=7168, experts=256, top_k=8, tokens=64)
    capacity = 300_000
    assert capacity * problem.hidden > 2**31
    expert_out = torch.empty(capacity, problem.hidden, dtype=torch.bfloat16, device=CUDA)
    g = torch.Generator(CUDA).manual_seed(0)
    row_of = torch.randint(capacity - 400, capacity, (64, 8), generator=g, device=CUDA,
                           dtype=torch.int32)
    used = row_of.flatten().long().unique()
    expert_out[used] = torch.randn(used.numel(), problem.hidden, generator=g,
                                   device=CUDA).bfloat16()
    weights = torch.rand(64, 8, generator=g, device=CUDA)
    expected = moe_common.reference_combine(expert_out, row_of, weights)
    for config in (KERNEL.default_config(problem, H200), CombineConfig(1, 1, 8),
                   CombineConfig(1, 4, 4)):
        out = torch.full((64, problem.hidden), float("nan"), dtype=torch.bfloat16,
                         device=CUDA)
        KERNEL.launch(_compiled(problem, config),
                      {"expert_out": expert_out, "row_of": row_of, "topk_weights": weights,
                       "out": out})
        torch.cuda.synchronize()
        compare(f"{config} out", out, expected, *FLOAT_TOLERANCE["bfloat16"])


# ---------------------------------------------------------------------------------------------
# The public op


@pytest.mark.parametrize(("dtype", "hidden", "experts", "top_k"), [
    ("bfloat16", 2048, 128, 8), ("float16", 4096, 8, 2), ("float16", 1002, 60, 4),
])
@pytest.mark.parametrize("tokens", [1, 5, 300, 5000])
def test_public_op_matches_reference(dtype, hidden, experts, top_k, tokens):
    problem = _problem(dtype, hidden=hidden, experts=experts, top_k=top_k, tokens=tokens)
    tensors = _inputs(problem, seed=tokens, skewed=True)
    expected = KERNEL.reference(tensors, problem)["out"]
    rtol, atol = FLOAT_TOLERANCE[dtype]
    out = moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"])
    torch.cuda.synchronize()
    assert out.shape == (tokens, hidden) and out.dtype is TORCH_DTYPES[dtype]
    compare("out", out, expected, rtol, atol)
    given = tensors["out"]
    assert moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"],
                          out=given, experts=experts) is given
    torch.cuda.synchronize()
    compare("out", given, expected, rtol, atol)


def test_public_op_identity_experts_and_local_range():
    problem = _problem(tokens=50)
    dispatched, weights, expected = _identity_case(problem, seed=50)
    out = moe_combine(dispatched["dispatched"], dispatched["row_of"], weights,
                         experts=128)
    torch.cuda.synchronize()
    compare("out", out, expected, *FLOAT_TOLERANCE["bfloat16"])
    local = _problem(tokens=50, begin=96, end=128)
    tensors = _inputs(local, seed=1)
    out = moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"],
                         experts=128, expert_begin=96, expert_end=128)
    torch.cuda.synchronize()
    compare("out", out, KERNEL.reference(tensors, local)["out"], *FLOAT_TOLERANCE["bfloat16"])


def test_public_op_skips_rows_outside_the_capacity():
    problem = _problem(tokens=100)
    tensors = _inputs(problem, seed=3)
    sane = _corrupt(tensors, problem.capacity)
    out = moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"])
    torch.cuda.synchronize()
    compare("out", out, moe_common.reference_combine(tensors["expert_out"], sane,
                                                     tensors["topk_weights"]),
            *FLOAT_TOLERANCE["bfloat16"])


def test_public_op_padded_rows():
    """expert_out and out as views into wider buffers (a GEMM's padded leading dimension, an
    engine's workspace): out's padding stays untouched."""
    problem = _problem(tokens=33)
    tensors = _inputs(problem, seed=33)
    wide = torch.zeros(problem.capacity, 2048 + 64, dtype=torch.bfloat16, device=CUDA)
    wide[:, :2048] = tensors["expert_out"]
    out_buffer = torch.full((33, 2048 + 3 * 8), 7.0, dtype=torch.bfloat16, device=CUDA)
    out = out_buffer[:, 8: 8 + 2048]
    moe_combine(wide[:, :2048], tensors["row_of"], tensors["topk_weights"], out=out)
    torch.cuda.synchronize()
    compare("out", out, KERNEL.reference(tensors, problem)["out"],
            *FLOAT_TOLERANCE["bfloat16"])
    assert torch.all(out_buffer[:, :8] == 7.0) and torch.all(out_buffer[:, 8 + 2048:] == 7.0)


def test_public_op_with_no_tokens_or_no_rows():
    expert_out = torch.randn(16, 2048, device=CUDA).bfloat16()
    empty = torch.empty(0, 8, dtype=torch.int32, device=CUDA)
    out = moe_combine(expert_out, empty, torch.empty(0, 8, device=CUDA))
    assert out.shape == (0, 2048)
    # No expert rows (e.g. no pair routed to this rank and a buffer sized to the rows used):
    # every pair is skipped, the output is zero.
    row_of = torch.full((3, 8), -1, dtype=torch.int32, device=CUDA)
    out = moe_combine(expert_out[:0], row_of, torch.rand(3, 8, device=CUDA))
    torch.cuda.synchronize()
    assert out.shape == (3, 2048) and bool((out == 0).all())


def test_public_op_goes_through_the_dispatcher():
    from cutetune.serving.warmup import current_dispatcher

    problem = _problem(tokens=7)
    tensors = _inputs(problem, seed=7)
    moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"],
                   experts=128)
    calls = current_dispatcher().default_calls()
    assert calls[("moe_combine", problem.static_tuple(), 8)] >= 1
    assert problem.static_tuple() == ("bfloat16", 2048, 128, 8, 16, 0, 128, False)


def test_public_op_captures_into_a_cuda_graph():
    problem = _problem(tokens=64)
    tensors = _inputs(problem, seed=64)
    args = (tensors["expert_out"], tensors["row_of"], tensors["topk_weights"])
    out = tensors["out"]
    moe_combine(*args, out=out)  # compile outside the capture
    out.fill_(float("nan"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        moe_combine(*args, out=out)
    graph.replay()
    torch.cuda.synchronize()
    compare("out", out, KERNEL.reference(tensors, problem)["out"], *FLOAT_TOLERANCE["bfloat16"])


def test_public_op_rejects_tensors_on_other_devices():
    problem = _problem(tokens=5)
    tensors = _inputs(problem, seed=5)
    with pytest.raises(ValueError, match="out is on cpu but expert_out is on cuda"):
        moe_combine(tensors["expert_out"], tensors["row_of"], tensors["topk_weights"],
                       out=torch.empty(5, 2048, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="row_of is on cpu but expert_out is on cuda"):
        moe_combine(tensors["expert_out"], tensors["row_of"].cpu(),
                       tensors["topk_weights"])
