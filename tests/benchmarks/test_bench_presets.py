"""benchmarks/bench_presets.sh: its default pairs, run without arguments, bench every kernel the
package registers on a model that uses it, so one command refreshes every table of BENCHMARKS.md's
"Kernels against the peers"."""

from __future__ import annotations

import re
from pathlib import Path

from cutetune.kernels.names import KERNEL_NAMES
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.spaces.models import load_model

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_presets.sh"


def default_pairs() -> list[tuple[str, str]]:
    defaults = SCRIPT.read_text().split("if [ ${#pairs[@]} -eq 0 ]")[1]
    listing = re.search(r"pairs=\((.*?)\)", defaults, re.S).group(1)
    return [tuple(pair.split(":", 1)) for pair in listing.split()]


def test_the_default_pairs_bench_every_kernel_on_a_model_that_uses_it():
    pairs = default_pairs()
    # The package's kernels, not whatever this worker has registered (a test kernel too).
    assert {kernel for kernel, _ in pairs} == set(KERNEL_NAMES)
    root = SCRIPT.parents[1]
    for kernel, model in pairs:
        path = root / model
        shape = load_model(str(path) if path.exists() else model)
        try:
            problems = get_kernel(kernel).problems_for_model(shape, "bfloat16")
        except NotApplicableError as refused:
            raise AssertionError(f"{kernel}:{model} does not apply: {refused}") from None
        assert problems, f"{kernel}:{model} gives no problem"
