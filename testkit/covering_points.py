"""A few points of a space that still exercise every code path: every pair of knob values that
occurs among the valid points occurs in at least one chosen point (all-pairs coverage), and the
points the kernel serves without tuning (its default config) are always among them.

Each knob selects code at compile time (a form, a vector width, a cache hint, a block size that
sizes a reduction tree), and the bugs we have met came from one knob or from two interacting;
all-pairs catches both at a few percent of the points. The full sweep stays under the `sweep`
marker for what needs three knobs at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from cutetune.spaces.space import config_to_dict

# A knob and its value, as config_to_dict gives them (None is a value like any other, and a
# point of one of several forms carries its form as a knob).
Setting = tuple[str, Any]


def knob_pairs(point: Any) -> set[frozenset[Setting]]:
    """Every single setting and every pair of settings of one point. Singles count too, so
    that a space of one knob (or a form with one knob of its own) is covered as well."""
    settings = sorted(config_to_dict(point).items(), key=lambda item: item[0])
    return ({frozenset((s,)) for s in settings}
            | {frozenset(pair) for pair in itertools.combinations(settings, 2)})


def covering_points(points: Sequence[Any], required: Iterable[Any] = ()) -> list[Any]:
    """`required` (deduplicated, in order), then greedily the point of `points` that covers
    the most pairs still uncovered (the first such in `points`: deterministic), until every
    pair that occurs in `points` is covered."""
    chosen = list(dict.fromkeys(required))
    uncovered = set().union(*(knob_pairs(p) for p in points)) if points else set()
    for point in chosen:
        uncovered -= knob_pairs(point)
    candidates = {point: knob_pairs(point) for point in points if point not in chosen}
    while uncovered:
        best = max(candidates, key=lambda p: len(candidates[p] & uncovered))
        chosen.append(best)
        uncovered -= candidates.pop(best)
    return chosen


def served_defaults(kernel, problem, device, buckets: Iterable[int]) -> list[Any]:
    """The default config the dispatcher serves for `problem` at each token count, unique."""
    return list(dict.fromkeys(kernel.default_config(problem.with_tokens(n), device)
                              for n in buckets))


def covering_configs(kernel, problem, device, default_buckets: Iterable[int] | None = None
                     ) -> list[Any]:
    """The covering points of `problem`'s valid points, led by the defaults at
    `default_buckets` (None: only at the problem's own token count, where a test launches it;
    a compile test passes every bucket, since one compile serves every token count)."""
    buckets = (problem.num_tokens,) if default_buckets is None else default_buckets
    valid = kernel.space.enumerate(problem, device).valid
    return covering_points(valid, served_defaults(kernel, problem, device, buckets))



# Parametrise a test over this to check the covering points by default and every valid point
# under the `sweep` marker.
WHICH_POINTS = ("covering", pytest.param("every", marks=pytest.mark.sweep))


def narrowed(which: str, points: Sequence[Any]) -> list[Any]:
    """The covering points of `points` ("covering") or all of them ("every")."""
    return list(points) if which == "every" else covering_points(points)


def selected_points(which: str, kernel, problem, device) -> list[Any]:
    """The covering points of `problem` ("covering") or all its valid points ("every")."""
    if which == "every":
        return list(kernel.space.enumerate(problem, device).valid)
    return covering_configs(kernel, problem, device)
