"""BENCHMARKS.md is generated from the committed measurements (benchmarks/benchmarks_md.py):
it must be what the data gives, and the data must say where each file came from."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def generator(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS_DIR))
    return importlib.import_module("benchmarks_md")


def test_benchmarks_md_is_what_the_committed_data_gives(generator):
    assert generator.OUT.read_text() == generator.benchmarks_md(), (
        "BENCHMARKS.md is stale: run python3 benchmarks/benchmarks_md.py")


@pytest.fixture
def results_copy(generator, tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(generator.RESULTS, copy)
    monkeypatch.setattr(generator, "RESULTS", copy)
    return copy


def test_a_data_file_the_index_does_not_list_is_refused(generator, results_copy):
    (results_copy / "bench-mystery.csv").write_text("gpu,kernel\n")
    with pytest.raises(SystemExit, match="does not list: bench-mystery.csv"):
        generator.benchmarks_md()


def test_a_listed_file_that_is_missing_is_refused(generator, results_copy):
    (results_copy / "warmup-qwen3-8b-3a94d99.csv").unlink()
    with pytest.raises(SystemExit, match="not there: warmup-qwen3-8b-3a94d99.csv"):
        generator.benchmarks_md()


def test_every_section_comes_from_its_data(generator):
    text = generator.benchmarks_md()
    for heading in ("## Method", "## Kernels against the peers",
                    "## Tuned winners of the shipped models", "## Whole-model tuning time",
                    "## Warmup time", "## Host time per call", "## Targets missed"):
        assert heading in text
    # A number from each kind of file, as the file holds it.
    assert "| qwen3-8b | 60 | 112.95 s | 13.447 s | 16 |" in text
    assert "**40.46 us**" in text
    assert "555.04 (104.8%)" in text
