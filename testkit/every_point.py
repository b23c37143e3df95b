"""Checking every point of a space: each failure is collected rather than raised at once, so
one run lists every failing point (a GPU run that stops at the first leaves the rest
unexercised)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cutetune.spaces.space import config_to_json


def assert_every_point(configs: Sequence, check: Callable[[int, object], None],
                       what: str) -> None:
    """Call check(index, config) for every config; then fail with one line per failing
    config (its first line of error: a comparison's report can run to many lines)."""
    failures = []
    for index, config in enumerate(configs):
        try:
            check(index, config)
        except Exception as err:  # any error fails the test, listed with its config
            first_line = (str(err).strip().splitlines() or [""])[0]
            failures.append(f"{config_to_json(config)}: {type(err).__name__}: {first_line}")
    assert not failures, (f"{len(failures)} of {len(configs)} points of {what} failed:\n"
                          + "\n".join(failures))
