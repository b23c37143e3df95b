"""The report notebook run headless (nbclient, on the CPU) against the committed H200 results
and against a copy with every section's data; and its HTML page."""

from __future__ import annotations

import json
import re

import nbformat

from cutetune.report.figures import FIGURES
from cutetune.report.notebook import (
    PARAMETERS_TAG,
    SECTION_KEY,
    execute,
    report_notebook,
    to_html,
    with_parameters,
)
from cutetune.report.tables import SECTIONS
from cutetune.results_db import Database
from testkit.h200_results import H200_URL, add_bench_and_failures, current_copy


def run(db_url: str, model: str = "qwen3-8b") -> tuple[nbformat.NotebookNode, list[str]]:
    """The executed notebook (nbclient raises CellExecutionError on any failing cell), and
    the sections in the order they started."""
    started: list[str] = []
    notebook = with_parameters(report_notebook(), db_url=db_url, model=model, device=None,
                               dtype="bfloat16")
    return execute(notebook, on_section=started.append, timeout_s=300), started


def outputs_by_section(notebook) -> dict[str, list[dict]]:
    return {cell.metadata[SECTION_KEY]: cell.outputs for cell in notebook.cells
            if SECTION_KEY in cell.metadata}


def kinds(outputs: list[dict]) -> set[str]:
    return {kind for output in outputs for kind in output.get("data", {})}


def text_of(outputs: list[dict]) -> str:
    return "\n".join(output.get("data", {}).get("text/markdown", "") for output in outputs)


def test_the_shipped_notebook_has_no_outputs_and_one_cell_per_section():
    notebook = report_notebook()
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
    tagged = [c for c in notebook.cells if PARAMETERS_TAG in c.metadata.get("tags", ())]
    assert len(tagged) == 1
    assert [c.metadata[SECTION_KEY] for c in notebook.cells if SECTION_KEY in c.metadata] == \
        [s.key for s in SECTIONS]


def test_every_section_draws_its_figure_and_table(tmp_path):
    url = current_copy(tmp_path)
    add_bench_and_failures(url)
    notebook, started = run(url)
    assert started == [s.key for s in SECTIONS]
    for key, outputs in outputs_by_section(notebook).items():
        if key == "rejected":  # every stored winner is valid: its one line (test_stored_rows)
            assert SECTIONS[[s.key for s in SECTIONS].index(key)].empty in text_of(outputs)
            continue
        assert "text/html" in kinds(outputs), (key, outputs)  # the table
        assert ("image/png" in kinds(outputs)) == (key in FIGURES), (key, kinds(outputs))
    page = to_html(notebook)
    assert len(re.findall(r'<img[^>]*src="data:image/png;base64,', page)) == len(FIGURES)
    # One self-contained page: nothing is fetched when it is opened.
    assert re.findall(r"<script[^>]*\bsrc=|<link[^>]*\bhref=\"http", page) == []
    assert "Report of qwen3-8b on NVIDIA H200" in page


def test_sections_without_data_say_so(tmp_path):
    notebook, _ = run(H200_URL)
    sections = outputs_by_section(notebook)
    for section in SECTIONS:
        outputs = sections[section.key]
        # No bench rows, nothing failed, every stored winner valid.
        if section.key in ("bench", "speedup", "failures", "rejected"):
            assert section.empty in text_of(outputs), outputs
            assert kinds(outputs) == {"text/markdown", "text/plain"}
        else:
            assert "text/html" in kinds(outputs), (section.key, outputs)
    # An empty database: every section is its one line, and the page says nothing is tuned.
    # The kernel imports the cutetune under test, not another one installed.
    import cutetune

    empty_url = f"sqlite:///{tmp_path / 'empty.db'}"
    Database.open(empty_url).dispose()
    empty = with_parameters(report_notebook(), db_url=empty_url, model="qwen3-8b")
    empty.cells.append(nbformat.v4.new_code_cell("import cutetune; print(cutetune.__file__)"))
    execute(empty, timeout_s=300)
    for section in SECTIONS:
        assert section.empty in text_of(outputs_by_section(empty)[section.key])
    assert "Nothing is tuned for qwen3-8b" in json.dumps(empty.cells[3].outputs)
    assert empty.cells[-1].outputs[0]["text"].strip() == cutetune.__file__
