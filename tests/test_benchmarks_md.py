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
    (results_copy / "warmup-2339b97.csv").unlink()
    with pytest.raises(SystemExit, match="not there: warmup-2339b97.csv"):
        generator.benchmarks_md()


def test_every_section_comes_from_its_data(generator):
    text = generator.benchmarks_md()
    for heading in ("## Method", "## Kernels against the peers",
                    "## Tuned winners of the shipped models", "## Whole-model tuning time",
                    "## Warmup time", "## Host time per call", "## Targets missed"):
        assert heading in text
    # A number from each kind of file, as the file holds it.
    assert "| qwen3-8b | 60 | 15.03 s | 4.089 s | 16 |" in text
    assert "**24.63 us**" in text
    assert "555.04 (104.8%)" in text


def add_listed_file(results: Path, name: str, kind: str, text: str, command: str) -> None:
    """A data file in the results copy, and its row in the index."""
    (results / name).write_text(text)
    with (results / "index.csv").open("a") as index:
        index.write(f"{name},{kind},abc1234,2026-12-02,one H200,{command}\n")


def test_the_host_steps_table_comes_from_a_listed_units_file(generator, results_copy):
    add_listed_file(results_copy, "host-units-qwen3-8b-abc1234.csv", "host_units",
                    "model,step,us\nqwen3-8b,a view (t[:]),2.9\n",
                    "python3 benchmarks/op_host_overhead.py qwen3-8b --units F")
    text = generator.benchmarks_md()
    assert "### The single host steps" in text
    assert "| qwen3-8b | a view (t[:]) | 2.90 |" in text
    assert text.index("## Host time per call") < text.index("### The single host steps")


def test_the_warmup_table_shows_the_cutedsl_import_where_measured(generator, results_copy):
    add_listed_file(results_copy, "warmup-abc1234.csv", "warmup",
                    "model,winners,points,cold_s,warm_s,warm_loaded,cutedsl_import_s,cpus\n"
                    "qwen3-8b,64,60,15.0,4.1,60,2.74,16\n",
                    "python3 benchmarks/warmup_time.py F qwen3-8b")
    text = generator.benchmarks_md()
    assert "| model | distinct points | cold | warm | CPU cores | CuTeDSL import |" in text
    assert "| qwen3-8b | 60 | 15.0 s | 4.1 s | 16 | 2.74 s |" in text
    assert "| qwen3-8b | 60 | 15.03 s | 4.089 s | 16 |\n" in text  # the file without it
