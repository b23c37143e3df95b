"""What the kernels' CI compile sweeps share: compiling points for sm_90a with every failure
listed, and the PTX of one point with its global accesses."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from cutetune.kernels.registry import NotApplicableError
from cutetune.spaces.models import PRESETS
from testkit.every_point import assert_every_point

# A global access: ld.global[.nc].v4.b32, st.global.b32, ...; group 1 the op, 2 the vector
# count (absent: 1), 3 the bits per lane of the vector.
GLOBAL_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d+))?\.[bfsu](\d+)\b")


def preset_params(kernel, suffix: Callable[[Any], str] | None = None) -> list:
    """A pytest param per distinct static problem the presets give `kernel` (in bf16), named
    after the first preset that gives it (then "-" and `suffix(problem)`, for a kernel a preset
    gives several problems). A problem two presets share (llama-3.1-8b-fp4's are
    llama-3.1-8b's) is one param, so it compiles once; presets the kernel does not apply to
    give none."""
    first: dict[str, tuple[str, Any]] = {}
    for name in PRESETS:
        for problem in _problems(kernel, name):
            first.setdefault(problem.static_key(), (name, problem))
    return [pytest.param(problem, id=name if suffix is None else f"{name}-{suffix(problem)}")
            for name, problem in first.values()]


def presets_of(kernel) -> set[str]:
    """The names of the presets that give `kernel` a problem."""
    return {name for name in PRESETS if _problems(kernel, name)}


def _problems(kernel, preset: str) -> list:
    try:
        return kernel.problems_for_model(PRESETS[preset], "bfloat16")
    except NotApplicableError:
        return []


def assert_points_compile(kernel, problem, configs) -> None:
    """Compile every point for sm_90a; fail listing every point that did not compile."""

    def compiles(_, config) -> None:
        if not callable(kernel.compile(problem, config)):
            raise TypeError("compiled result is not callable")

    assert_every_point(configs, compiles, f"{problem.describe()} (compiling)")


def ptx_of(kernel, problem, config, device, tmp_path, monkeypatch) -> str:
    """The PTX of one valid point. --keep-ptx writes into the dump dir, which defaults to the
    working directory at the time cutlass was imported, not the current one: name the
    directory explicitly (and chdir too, so nothing can land in the checkout)."""
    monkeypatch.chdir(tmp_path)
    kernel.space.check(problem, config, device)
    kernel.compile(problem, config, options=f"--keep-ptx --dump-dir {tmp_path}")
    (ptx_file,) = tmp_path.glob("*.ptx")
    return ptx_file.read_text()
