"""The MoE layout contract on the CPU: problems, routing inputs, the torch reference, and the
dispatch check (which must accept any order within a segment and reject everything else)."""

import dataclasses

import pytest
import torch

from cutetune.kernels import moe_common as moe
from cutetune.kernels.registry import NotApplicableError, VerificationError
from cutetune.spaces.models import PRESETS


def problem(**changes) -> moe.MoEProblem:
    base = moe.MoEProblem(num_tokens=6, dtype="bfloat16", hidden=16, experts=8, top_k=2, pad=4,
                          expert_begin=0, expert_end=8)
    return dataclasses.replace(base, **changes)


def dispatched(p, skewed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, weights = moe.make_routing(p, "cpu", g, skewed)
    x = torch.randn(p.num_tokens, p.hidden, generator=g).bfloat16()
    return x, ids, weights, moe.reference_dispatch(x, ids, p)


@pytest.mark.parametrize(("changes", "message"), [
    ({"top_k": 9}, "top_k 9 must be between 1 and the expert count 8"),
    ({"dtype": "float32"}, "dtype 'float32' not supported: use bfloat16, float16"),
    ({"expert_begin": 4, "expert_end": 4}, r"local experts \[4, 4\) must be a non-empty range"),
    ({"pad": 0}, "hidden, experts and pad must be positive"),
])
def test_bad_problems_say_why(changes, message):
    with pytest.raises(ValueError, match=message):
        problem(**changes)


def test_presets_with_experts_have_one_problem_and_others_none():
    (p,) = moe.problems_for_model(PRESETS["deepseek-v3"], "bfloat16")
    assert (p.hidden, p.experts, p.top_k, p.pad) == (7168, 256, 8, moe.DEFAULT_PAD)
    with pytest.raises(NotApplicableError, match="llama-3.1-8b has no routed experts"):
        moe.problems_for_model(PRESETS["llama-3.1-8b"], "bfloat16")
    with pytest.raises(NotApplicableError, match="not float32"):
        moe.problems_for_model(PRESETS["mixtral-8x7b"], "float32")


def test_capacity_bounds_the_rows_used():
    p = problem(num_tokens=50)
    for skewed in (False, True):
        _, ids, _, ref = dispatched(p, skewed)
        assert int(ref["offsets"][-1]) <= p.capacity == 50 * 2 + 8 * 3
        assert int(ref["counts"].sum()) == 100


def test_reference_layout_by_hand():
    p = problem(num_tokens=3, experts=4, expert_end=4, pad=2)
    ids = torch.tensor([[1, 0], [1, 3], [0, 1]], dtype=torch.int32)
    layout = moe.reference_layout(ids, p)
    assert layout["counts"].tolist() == [2, 3, 0, 1]
    assert layout["offsets"].tolist() == [0, 2, 6, 6, 8]
    # Each expert's pairs in token order: expert 0 rows 0-1, expert 1 rows 2-4, expert 3 row 6.
    assert layout["row_of"].tolist() == [[2, 0], [3, 6], [1, 4]]
    assert layout["error"].tolist() == [0]


def test_local_range_and_bad_ids_map_to_minus_one_and_raise_the_flag():
    p = problem(num_tokens=2, experts=4, pad=1, expert_begin=2, expert_end=4)
    ids = torch.tensor([[2, 0], [3, 7]], dtype=torch.int32)
    layout = moe.reference_layout(ids, p)
    assert layout["counts"].tolist() == [1, 1]
    assert layout["row_of"].tolist() == [[0, -1], [1, -1]]
    assert layout["error"].tolist() == [1]


def test_identity_experts_combine_to_the_weighted_token():
    p = problem(num_tokens=5)
    x, _, weights, ref = dispatched(p)
    out = moe.reference_combine(ref["dispatched"], ref["row_of"], weights)
    torch.testing.assert_close(out, x.float() * weights.sum(1, keepdim=True))


def test_check_accepts_any_order_within_a_segment():
    p = problem(num_tokens=20)
    x, ids, _, ref = dispatched(p, skewed=True)
    # Reverse the rows of each expert's segment.
    got = {k: v.clone() for k, v in ref.items()}
    rows = got["row_of"].flatten()
    for e in range(p.local_experts):
        start, count = int(ref["offsets"][e]), int(ref["counts"][e])
        members = (rows >= start) & (rows < start + count)
        rows[members] = 2 * start + count - 1 - rows[members]
    got["row_of"] = rows.view_as(ref["row_of"])
    got["dispatched"] = torch.zeros_like(ref["dispatched"])
    kept = rows >= 0
    got["dispatched"][rows[kept].long()] = x[torch.arange(rows.numel())[kept] // p.top_k]
    moe.check_dispatch(got, ref, p)


@pytest.mark.parametrize(("break_it", "message"), [
    (lambda g: g["counts"].__setitem__(0, g["counts"][0] + 1), "counts"),
    (lambda g: g["row_of"].view(-1).__setitem__(0, g["row_of"].view(-1)[1]), "row_of"),
    (lambda g: g["dispatched"].__setitem__(int(g["row_of"].view(-1)[0]), 7.0), "dispatched"),
    (lambda g: g["dispatched"].__setitem__(int(g["offsets"][-1]) - 1, 7.0), "padding"),
])
def test_check_rejects_a_broken_dispatch(break_it, message):
    p = problem(num_tokens=9, zero_padding=True)
    _, _, _, ref = dispatched(p)
    got = {k: v.clone() for k, v in ref.items()}
    break_it(got)
    with pytest.raises(VerificationError, match=message):
        moe.check_dispatch(got, ref, p)


def test_padding_rows_are_free_unless_zero_padding_is_asked_for():
    p = problem(num_tokens=9)
    _, _, _, ref = dispatched(p)
    got = {k: v.clone() for k, v in ref.items()}
    last_padding_row = int(got["offsets"][-1]) - 1
    assert not bool((got["row_of"] == last_padding_row).any())  # a padding row, not a pair's
    got["dispatched"][last_padding_row] = float("nan")
    moe.check_dispatch(got, ref, p)
    with pytest.raises(VerificationError, match="padding"):
        moe.check_dispatch(got, ref, dataclasses.replace(p, zero_padding=True))
