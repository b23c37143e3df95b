"""Every point the package's shipped winners serve compiles for sm_90a on the CPU: a warmup on
an H200 compiles (or loads) exactly these, so a kernel change that breaks one of them fails here
rather than at an engine's start."""

from __future__ import annotations

import json
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pytest

from cutetune.kernels.registry import get_kernel
from testkit.compile_checks import assert_points_compile


def shipped_points() -> dict[tuple[str, str], list[dict]]:
    """The distinct configs of the shipped winners, by kernel and static problem."""
    folder = Path(str(resources.files("cutetune") / "shipped_winners"))
    points: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        for record in json.loads(path.read_text()):
            configs = points[(record["kernel_name"], record["static_key"])]
            if record["config"] not in configs:
                configs.append(record["config"])
    return dict(points)


SHIPPED = shipped_points()


def _problem(kernel_name: str, static_key: str):
    return get_kernel(kernel_name).problem_type(num_tokens=1, **json.loads(static_key))


@pytest.mark.parametrize(("kernel_name", "static_key"), [
    pytest.param(*key, id=_problem(*key).describe()) for key in sorted(SHIPPED)])
def test_every_shipped_point_compiles(kernel_name, static_key):
    kernel = get_kernel(kernel_name)
    configs = [kernel.space.config_from_dict(c) for c in SHIPPED[(kernel_name, static_key)]]
    assert_points_compile(kernel, _problem(kernel_name, static_key), configs)
