"""Untuned problems served a winner borrowed from another problem of the kernel at the same
bucket (serving/plan.py, device/funnel.py `borrowed_pick`): the nearest problem in bytes moved
whose winner is valid there lends it, or with a calibration the one whose point it predicts
fastest; planned at warmup only; stale, rejected and invalid
winners lend nothing; the user's winner of a problem over the shipped one."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cutetune.device.funnel import Lender, lenders_by_bucket, lent_points
from cutetune.device.knob_effects import KnobEffects
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import activation as act
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.registry import get_kernel
from cutetune.serving.plan import BORROWED, DEFAULT, ServingPlan
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import load_model
from testkit.known_cost_model import KNOWN
from testkit.stored_winners import winner

SPEC = DEVICE_SPECS["H200"]
KERNEL = qk.KERNEL
SMALL = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
LARGE = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)


@pytest.fixture(scope="module")
def qwen3_8b() -> qk.QKNormProblem:
    (problem,) = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    return problem


def served(plan: ServingPlan, problem, at_warmup: bool = True) -> dict[int, tuple]:
    return {e.bucket: (e.source, e.config, e.lender)
            for e in plan.entries(KERNEL, problem, at_warmup=at_warmup)}


def test_the_nearest_problem_in_bytes_lends_its_winner_at_each_bucket(qwen3_8b):
    # 32 + 8 heads: 16 + 8 heads move 0.6x the bytes, 64 + 8 heads 1.8x.
    fewer = dataclasses.replace(qwen3_8b, q_heads=16)
    more = dataclasses.replace(qwen3_8b, q_heads=64)
    plan = ServingPlan(SPEC, [winner(KERNEL, fewer, 8, LARGE), winner(KERNEL, more, 8, SMALL),
                              winner(KERNEL, more, 64, SMALL)])
    entries = served(plan, qwen3_8b)
    assert entries[8] == (BORROWED, LARGE, Lender(KERNEL.name, fewer.static_key()))
    assert entries[64] == (BORROWED, SMALL, Lender(KERNEL.name, more.static_key()))
    assert {entries[b][0] for b in BUCKETS if b not in (8, 64)} == {DEFAULT}
    # A miss on the call path reads no other problem's winners.
    assert {source for source, _, _ in served(plan, qwen3_8b, at_warmup=False).values()} == {
        DEFAULT}


def test_a_winner_invalid_here_lends_nothing_and_a_farther_valid_one_does(qwen3_8b):
    narrow = dataclasses.replace(qwen3_8b, head_dim=64)  # SMALL splits no 64-wide head
    near = dataclasses.replace(qwen3_8b, q_heads=24)
    far = dataclasses.replace(qwen3_8b, q_heads=64)
    assert KERNEL.space.first_violation(narrow.with_tokens(8), SMALL, SPEC) is not None
    plan = ServingPlan(SPEC, [winner(KERNEL, near, 8, SMALL)])
    assert served(plan, narrow)[8][0] == DEFAULT
    plan = ServingPlan(SPEC, [winner(KERNEL, near, 8, SMALL), winner(KERNEL, far, 8, LARGE)])
    assert served(plan, narrow)[8] == (BORROWED, LARGE, Lender(KERNEL.name, far.static_key()))


def test_stale_winners_lend_nothing_and_the_users_winner_lends_over_the_shipped(qwen3_8b):
    other = dataclasses.replace(qwen3_8b, q_heads=16)
    stale = ServingPlan(SPEC, [winner(KERNEL, other, 8, LARGE, source_hash="0" * 16)])
    assert served(stale, qwen3_8b)[8][0] == DEFAULT
    both = ServingPlan(SPEC, [winner(KERNEL, other, 8, SMALL)],
                       shipped=[winner(KERNEL, other, 8, LARGE)])
    assert served(both, qwen3_8b)[8] == (BORROWED, SMALL, Lender(KERNEL.name, other.static_key()))


def test_a_calibration_borrows_the_lent_point_it_predicts_fastest_here(qwen3_8b):
    near = dataclasses.replace(qwen3_8b, q_heads=24)
    far = dataclasses.replace(qwen3_8b, q_heads=64)
    lenders = [winner(KERNEL, near, 8, SMALL), winner(KERNEL, far, 8, LARGE)]
    # The terms alone rank SMALL first here: the nearest lender's point stays.
    plain = ServingPlan(SPEC, lenders, calibrated=KNOWN)
    assert served(plain, qwen3_8b)[8] == (BORROWED, SMALL, Lender(KERNEL.name, near.static_key()))
    # Knob factors that make four heads per warp ten times faster pick the farther one's.
    knobs = KnobEffects({KERNEL.name: {8: {"heads_per_warp=4": math.log(0.1)}}}, {})
    fitted = ServingPlan(SPEC, lenders, calibrated=dataclasses.replace(KNOWN, knobs=knobs))
    assert served(fitted, qwen3_8b)[8] == (BORROWED, LARGE, Lender(KERNEL.name, far.static_key()))


def test_a_kernel_borrows_from_the_kernels_it_names_where_its_own_problems_lend_none():
    silu, gelu = get_kernel("silu_and_mul"), get_kernel("gelu_and_mul")
    problem = act.GeluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=21504,
                                    approximate="tanh")
    swiglu = act.SiluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=12288)
    other_gelu = dataclasses.replace(problem, intermediate=8192)
    wide = act.ActivationConfig(vector_bits=128, vectors_per_thread=2, warps_per_block=4)
    narrow = act.ActivationConfig(vector_bits=64, vectors_per_thread=1, warps_per_block=8)
    kin = ServingPlan(SPEC, [winner(silu, swiglu, 8, wide)])
    (entry,) = [e for e in kin.entries(gelu, problem) if e.bucket == 8]
    assert (entry.source, entry.config, entry.lender) == (
        BORROWED, wide, Lender("silu_and_mul", swiglu.static_key()))
    # A problem of its own lends first, however far; the kin's winner follows it when lent.
    winners = [winner(silu, swiglu, 8, wide), winner(gelu, other_gelu, 8, narrow)]
    (entry,) = [e for e in ServingPlan(SPEC, winners).entries(gelu, problem) if e.bucket == 8]
    assert (entry.config, entry.lender) == (narrow, Lender("gelu_and_mul",
                                                           other_gelu.static_key()))
    lenders = lenders_by_bucket(gelu, winners, SPEC)[8]
    assert [lender for lender, _ in lent_points(gelu, problem.with_tokens(8), SPEC, lenders)] == [
        Lender("gelu_and_mul", other_gelu.static_key()), Lender("silu_and_mul",
                                                               swiglu.static_key())]
    # A kernel that names none borrows nothing from another's winners.
    assert {e.source for e in ServingPlan(SPEC, [winner(silu, swiglu, 8, wide)]).entries(
        KERNEL, qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0])} == {DEFAULT}
