"""The every-point check lists every failing point, not just the first."""

from __future__ import annotations

import dataclasses

import pytest

from testkit.every_point import assert_every_point


@dataclasses.dataclass(frozen=True)
class Point:
    warps: int


def test_lists_every_failing_point_with_its_first_error_line():
    seen = []

    def check(index, point):
        seen.append(index)
        if point.warps % 2:
            raise ValueError(f"odd warps {point.warps}\nsecond line")

    with pytest.raises(AssertionError) as failed:
        assert_every_point([Point(w) for w in (1, 2, 3, 4)], check, "a problem")
    assert seen == [0, 1, 2, 3]
    message = str(failed.value)
    assert message.startswith("2 of 4 points of a problem failed:")
    assert '{"warps": 1}: ValueError: odd warps 1' in message
    assert '{"warps": 3}: ValueError: odd warps 3' in message
    assert "second line" not in message and '"warps": 2' not in message


def test_passes_when_every_point_passes():
    assert_every_point([Point(1), Point(2)], lambda index, point: None, "a problem")
