"""Space: params, named constraints, enumeration with reasons, checks and canonical JSON."""

import dataclasses
import json
import typing
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from cutetune.spaces.problem import Problem
from cutetune.spaces.space import (
    Alternatives,
    Constraint,
    EmptySpaceError,
    Param,
    Space,
    config_to_dict,
    config_to_json,
)


@dataclass(frozen=True, kw_only=True)
class ToyProblem(Problem):
    size: int


@dataclass(frozen=True)
class ToyConfig:
    # Declared out of alphabetical order so canonical JSON has to sort.
    unroll: int
    block: int


DEVICE = SimpleNamespace(max_block=32)

DIVIDES = Constraint("block_divides_size", "block must divide the problem size",
                     lambda p, c, d: p.size % c.block == 0)
SMALL_TILE = Constraint("tile_at_most_64", "block * unroll must not exceed 64",
                        lambda p, c, d: c.block * c.unroll <= 64)
FITS_DEVICE = Constraint("block_fits_device", "block must not exceed the device's max_block",
                         lambda p, c, d: c.block <= d.max_block)

PARAMS = (Param("block", (8, 16, 32, 64)), Param("unroll", (1, 2, 4)))
SPACE = Space(ToyConfig, PARAMS, (DIVIDES, SMALL_TILE, FITS_DEVICE))


def test_param_without_choices_is_rejected():
    with pytest.raises(ValueError, match="'block' declares no choices"):
        Param("block", ())


@pytest.mark.parametrize("params", [
    (Param("block", (8,)),),  # a Config field without a param
    (Param("block", (8,)), Param("unroll", (1,)), Param("stages", (1,))),  # an extra param
    (Param("block", (8,)), Param("block", (16,)), Param("unroll", (1,))),  # a duplicate
], ids=["missing", "extra", "duplicate"])
def test_params_must_match_config_fields(params):
    with pytest.raises(TypeError, match="must be exactly the fields of ToyConfig"):
        Space(ToyConfig, params, ())


def test_declared_count_is_product_of_choices():
    points = SPACE.declared_points()
    assert len(points) == 4 * 3
    assert len(set(points)) == 12
    assert all(isinstance(c, ToyConfig) for c in points)
    assert SPACE.enumerate(ToyProblem(num_tokens=1, size=64), DEVICE).declared == 12


def test_enumerate_keeps_valid_points_and_rejections_with_first_failing_constraint():
    # size 48: blocks 8 and 16 divide it, 32 and 64 do not.
    enumeration = SPACE.enumerate(ToyProblem(num_tokens=1, size=48), DEVICE)
    assert set(enumeration.valid) == {
        ToyConfig(unroll=1, block=8), ToyConfig(unroll=2, block=8), ToyConfig(unroll=4, block=8),
        ToyConfig(unroll=1, block=16), ToyConfig(unroll=2, block=16),
        ToyConfig(unroll=4, block=16),
    }
    by_config = {r.config: r for r in enumeration.rejected}
    assert len(by_config) == len(enumeration.rejected) == 6
    # block 32 and 64 fail DIVIDES first even where they also fail SMALL_TILE / FITS_DEVICE.
    for config in (ToyConfig(unroll=4, block=32), ToyConfig(unroll=1, block=64)):
        assert by_config[config].constraint == "block_divides_size"
        assert by_config[config].reason == "block must divide the problem size"
    assert enumeration.rejections_by_constraint() == {"block_divides_size": 6}


def test_enumerate_attribution_follows_constraint_order():
    # size 64: every block divides it, so tile and device limits decide.
    problem = ToyProblem(num_tokens=1, size=64)
    enumeration = SPACE.enumerate(problem, DEVICE)
    # Tile > 64: (32, 4), (64, 2), (64, 4); then block 64 unroll 1 exceeds max_block 32.
    assert enumeration.rejections_by_constraint() == {"tile_at_most_64": 3,
                                                      "block_fits_device": 1}
    assert len(enumeration.valid) == 8
    assert ToyConfig(unroll=1, block=32) in enumeration.valid

    reordered = Space(ToyConfig, PARAMS, (FITS_DEVICE, SMALL_TILE, DIVIDES))
    assert reordered.enumerate(problem, DEVICE).rejections_by_constraint() == {
        "block_fits_device": 3, "tile_at_most_64": 1}


def test_constraints_see_the_device():
    problem = ToyProblem(num_tokens=1, size=64)
    big_device = SimpleNamespace(max_block=64)
    assert ToyConfig(unroll=1, block=64) in SPACE.enumerate(problem, big_device).valid
    assert ToyConfig(unroll=1, block=64) not in SPACE.enumerate(problem, DEVICE).valid


def test_check_accepts_a_valid_point():
    assert SPACE.check(ToyProblem(num_tokens=1, size=48), ToyConfig(unroll=2, block=16),
                       DEVICE) is None


def test_check_names_the_violated_constraint():
    with pytest.raises(ValueError, match="violates block_divides_size: block must divide"):
        SPACE.check(ToyProblem(num_tokens=1, size=48), ToyConfig(unroll=1, block=32), DEVICE)
    with pytest.raises(ValueError, match="violates tile_at_most_64"):
        SPACE.check(ToyProblem(num_tokens=1, size=64), ToyConfig(unroll=4, block=32), DEVICE)


def test_check_rejects_values_outside_the_choices():
    # 12 passes every constraint for size 48 but is not a declared choice.
    with pytest.raises(ValueError, match=r"block=12 is not one of \(8, 16, 32, 64\)"):
        SPACE.check(ToyProblem(num_tokens=1, size=48), ToyConfig(unroll=1, block=12), DEVICE)
    with pytest.raises(ValueError, match="unroll=3 is not one of"):
        SPACE.check(ToyProblem(num_tokens=1, size=48), ToyConfig(unroll=3, block=8), DEVICE)


def test_valid_points_returns_the_valid_tuple():
    problem = ToyProblem(num_tokens=1, size=48)
    assert SPACE.valid_points(problem, DEVICE) == SPACE.enumerate(problem, DEVICE).valid


def test_valid_points_on_empty_space_names_what_removed_how_many():
    # size 7: no block divides it; every point is removed by the first constraint.
    with pytest.raises(EmptySpaceError, match="block_divides_size removed 12") as info:
        SPACE.valid_points(ToyProblem(num_tokens=1, size=7), DEVICE)
    assert "size=7" in str(info.value)
    assert isinstance(info.value, ValueError)

    # Two constraints share the removals: the message names both counts.
    never = Constraint("never", "nothing passes", lambda p, c, d: False)
    space = Space(ToyConfig, PARAMS, (SMALL_TILE, never))
    with pytest.raises(EmptySpaceError) as info:
        space.valid_points(ToyProblem(num_tokens=1, size=64), DEVICE)
    assert "tile_at_most_64 removed 3" in str(info.value)
    assert "never removed 9" in str(info.value)


def test_config_to_json_is_canonical():
    config = ToyConfig(unroll=2, block=16)
    text = config_to_json(config)
    assert text == '{"block": 16, "unroll": 2}'
    assert config_to_json(ToyConfig(2, 16)) == text
    assert json.loads(text) == config_to_dict(config)
    assert SPACE.config_from_dict(json.loads(text)) == config
    assert config_to_json(ToyConfig(unroll=4, block=16)) != text


def test_problem_static_key_excludes_tokens():
    small = ToyProblem(num_tokens=1, size=48)
    large = small.with_tokens(4096)
    assert large.num_tokens == 4096 and large.size == 48
    assert small.static_key() == large.static_key() == '{"size": 48}'
    assert small.static_tuple() == (48,)
    with pytest.raises(ValueError, match="num_tokens must be a positive integer"):
        ToyProblem(num_tokens=0, size=48)


def test_param_with_a_repeated_choice_is_rejected():
    with pytest.raises(ValueError, match="repeats a choice"):
        Param("warps", (1, 2, 2))


# -- Alternatives: a space of several forms ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Narrow:
    form: typing.ClassVar[str] = "narrow"
    width: int


@dataclasses.dataclass(frozen=True)
class _Wide:
    form: typing.ClassVar[str] = "wide"
    width: int
    hint: str = "plain"


def _forms(**shared) -> Alternatives:
    narrow = Space(_Narrow, (Param("width", (1, 2)),), ())
    wide = Space(_Wide, (Param("width", (4, 8, 16)), Param("hint", ("plain", "stream"))),
                 (Constraint("wide_fits", "width * problem size <= 64",
                             lambda p, c, d: c.width * p.size <= 64),))
    return Alternatives((narrow, wide), **shared)


@dataclasses.dataclass(frozen=True)
class _SizedProblem:
    size: int


def test_forms_enumerate_their_own_knobs_and_constraints_after_the_shared_ones():
    even = Constraint("even", "width even", lambda p, c, d: c.width % 2 == 0)
    space = _forms(constraints=(even,))
    enumeration = space.enumerate(_SizedProblem(8), None)
    assert enumeration.declared == 2 + 3 * 2
    assert set(enumeration.valid) == {_Narrow(2), _Wide(4, "plain"), _Wide(8, "plain"),
                                      _Wide(4, "stream"), _Wide(8, "stream")}
    assert enumeration.rejections_by_constraint() == {"even": 1, "wide_fits": 2}
    with pytest.raises(ValueError, match="violates wide_fits"):
        space.check(_SizedProblem(8), _Wide(16), None)
    with pytest.raises(ValueError, match="narrow width=4 is not one of"):
        space.check(_SizedProblem(8), _Narrow(4), None)


def test_a_point_of_a_form_round_trips_through_its_dict_and_through_sampling():
    space = _forms()
    for config in space.declared_points():
        assert config_to_dict(config)["form"] == config.form
        assert space.config_from_dict(config_to_dict(config)) == config
        assert space.config_from_sampled(space.sampled_values(config)) == config
    # Sampling names each knob under its form, so forms never share a knob's choices.
    asked = []

    def choose(name, choices):
        asked.append((name, choices))
        return choices[-1]

    assert space.sample(choose) == _Wide(16, "stream")
    assert asked == [("form", ("narrow", "wide")), ("wide.width", (4, 8, 16)),
                     ("wide.hint", ("plain", "stream"))]
    assert config_to_dict(_Narrow(1)) == {"form": "narrow", "width": 1}


def test_an_unknown_or_repeated_form_is_refused():
    with pytest.raises(ValueError, match="unknown form 'bulk': the forms are narrow, wide"):
        _forms().config_from_dict({"form": "bulk", "width": 1})
    narrow = Space(_Narrow, (Param("width", (1, 2)),), ())
    with pytest.raises(ValueError, match="repeat a name"):
        Alternatives((narrow, narrow))
