"""The one table renderer, and the tables the commands print through it."""

from __future__ import annotations

import pytest

from cutetune.bench import DEFAULT_NAME, TUNED_NAME, BenchRow
from cutetune.cli.bench import bench_table
from cutetune.cli.table import render_table
from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model


def test_columns_are_as_wide_as_their_widest_cell_numbers_right_aligned():
    text = render_table(("name", "us", "note"), [("a", "1.25", "fast"), ("longer", "12.50", "")],
                        right={"us"}, indent="  ")
    assert text.splitlines() == ["  name       us  note",
                                 "  a        1.25  fast",
                                 "  longer  12.50"]


def test_a_table_without_rows_is_its_header():
    assert render_table(("kernel", "arch"), []) == "kernel  arch"


@pytest.fixture(scope="module")
def problem() -> qk.QKNormProblem:
    (static,) = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    return static.with_tokens(8)


def row(problem, name, us):
    return BenchRow(problem, name, us, 0.01 if us else None, 1.0 if us else None,
                    1.0 if us else None, "" if us else "not run: missing")


def test_the_bench_table_shows_untimed_rows_with_their_note(problem):
    text = bench_table([row(problem, TUNED_NAME, 2.0), row(problem, DEFAULT_NAME, 3.0),
                        row(problem, "quack", 5.0), row(problem, "liger", None)])
    title, header, tuned, default, quack, liger, speedup = text.splitlines()
    assert title == problem.describe()
    assert header.split() == ["implementation", "us", "IQR", "GB/s", "%", "copy", "note"]
    assert tuned.split() == [*TUNED_NAME.split(), "2.00", "0.01", "1", "1.0%"]
    assert header.index(" us") + len(" us") == tuned.index("2.00") + len("2.00")
    assert liger.split() == ["liger", "-", "not", "run:", "missing"]
    assert speedup == "  cutetune vs best peer: 2.50x"
