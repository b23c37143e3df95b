"""What the kernels' CI compile sweeps share: compiling points for sm_90a with every failure
listed, and the PTX of one point with its global accesses."""

from __future__ import annotations

import re

import pytest

from cutetune.kernels.registry import NotApplicableError
from cutetune.spaces.models import PRESETS
from testkit.every_point import assert_every_point

# A global access: ld.global[.nc].v4.b32, st.global.b32, ...; group 1 the op, 2 the vector
# count (absent: 1), 3 the bits per lane of the vector.
GLOBAL_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d+))?\.[bfsu](\d+)\b")


def preset_params(kernel) -> list:
    """A pytest param per problem the presets give `kernel` (in bf16), named after its preset;
    presets the kernel does not apply to give none."""
    params = []
    for name, model in PRESETS.items():
        try:
            problems = kernel.problems_for_model(model, "bfloat16")
        except NotApplicableError:
            continue
        params += [pytest.param(problem, id=name) for problem in problems]
    return params


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
