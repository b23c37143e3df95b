"""The covering points: every pair of knob values among the valid points is in a chosen point,
the defaults lead, and the choice is the same on every run."""

from __future__ import annotations

import dataclasses
import itertools

from cutetune.spaces.models import load_model
from cutetune.spaces.space import Constraint, Param, Space
from testkit.covering_points import covering_configs, covering_points, knob_pairs


@dataclasses.dataclass(frozen=True)
class Point:
    form: str
    bits: int
    warps: int
    hints: str | None = None  # None: a form without the knob, still a value to cover


def _grid() -> list[Point]:
    return [Point(f, b, w, h) for f, b, w, h in itertools.product(
        ("a", "b"), (32, 64, 128), (1, 2, 4, 8), (None, "streaming"))]


def _missed(points, chosen) -> set:
    return set().union(*map(knob_pairs, points)) - set().union(*map(knob_pairs, chosen))


def test_every_pair_is_covered_by_far_fewer_points():
    points = _grid()
    chosen = covering_points(points)
    assert _missed(points, chosen) == set()
    assert set(chosen) <= set(points) and len(set(chosen)) == len(chosen)
    # At least bits x warps = 12 points are needed; greedy stays close to it.
    assert 12 <= len(chosen) <= 16 < len(points) == 48


def test_the_check_detects_a_missed_pair():
    points = _grid()
    chosen = covering_points(points)
    dropped = next(p for p in chosen if p.bits == 128 and p.warps == 8)
    rest = [p for p in chosen if p != dropped]
    assert frozenset({("bits", 128), ("warps", 8)}) in _missed(points, rest)


def test_required_points_lead_and_count_as_covering():
    points = _grid()
    default = Point("b", 64, 2, None)
    outside = Point("c", 16, 3)  # a default need not be a valid point at this token count
    chosen = covering_points(points, [default, outside, default])
    assert chosen[:2] == [default, outside] and chosen.count(default) == 1
    assert _missed(points, chosen) == set()


def test_the_choice_is_deterministic_and_follows_the_given_order():
    points = _grid()
    assert covering_points(points) == covering_points(list(points))
    assert covering_points(points)[0] == points[0]  # ties go to the first point


def test_forms_with_different_knobs_and_single_knob_spaces():
    @dataclasses.dataclass(frozen=True)
    class Split:
        form: str
        blocks: int

    @dataclasses.dataclass(frozen=True)
    class Fused:
        form: str
        warps: int

    points = [Split("split", b) for b in (8, 32)] + [Fused("fused", w) for w in (1, 4, 8)]
    chosen = covering_points(points)
    assert _missed(points, chosen) == set() and len(chosen) == 5  # every value of each form
    assert covering_points([]) == []


@dataclasses.dataclass(frozen=True)
class ToyProblem:
    num_tokens: int

    def with_tokens(self, n: int) -> ToyProblem:
        return ToyProblem(n)


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    bits: int
    warps: int


@dataclasses.dataclass(frozen=True)
class ToyKernel:
    space: Space

    @staticmethod
    def default_config(problem, device) -> ToyConfig:
        return ToyConfig(128, 1 if problem.num_tokens <= 4 else 8)


def test_covering_configs_lead_with_the_defaults_at_the_given_buckets():
    space = Space(ToyConfig, (Param("bits", (32, 128)), Param("warps", (1, 2, 8))),
                  (Constraint("few", "at most 2 warps below 64 bits",
                              lambda p, c, d: c.bits == 128 or c.warps <= 2),))
    kernel = ToyKernel(space)
    own = covering_configs(kernel, ToyProblem(1), None)
    assert own[0] == ToyConfig(128, 1) and ToyConfig(128, 8) in own
    every_bucket = covering_configs(kernel, ToyProblem(1), None, (1, 2, 1024))
    assert every_bucket[:2] == [ToyConfig(128, 1), ToyConfig(128, 8)]
    assert ToyConfig(32, 8) not in every_bucket  # not valid: never chosen


def test_the_points_of_several_forms_cover_every_form_and_its_knobs():
    """moe_dispatch's forms share knob names: the form is a knob of its own, so each form,
    and each value of each of its knobs, is among the covering points."""
    from cutetune.device.specs import DEVICE_SPECS
    from cutetune.kernels.moe_dispatch import KERNEL as DISPATCH
    from cutetune.spaces.space import config_to_dict

    (static,) = DISPATCH.problems_for_model(load_model("mixtral-8x7b"), "bfloat16")
    problem = static.with_tokens(64)
    valid = DISPATCH.space.valid_points(problem, DEVICE_SPECS["H200"])
    chosen = covering_configs(DISPATCH, problem, DEVICE_SPECS["H200"])
    settings = {(c.form, knob, value) for c in valid
                for knob, value in config_to_dict(c).items()}
    assert settings == {(c.form, knob, value) for c in chosen
                        for knob, value in config_to_dict(c).items()}
    assert len(chosen) < len(valid) / 2
