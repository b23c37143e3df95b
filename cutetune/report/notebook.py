"""Running the report notebook headless and writing it as one HTML file.

The notebook ships inside this package (`tuning_report.ipynb`, package data), so an installed
cutetune finds it wherever it was installed from; `notebooks/tuning_report.ipynb` in the source
tree is a link to it for those who open it in Jupyter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOK = "tuning_report.ipynb"
PARAMETERS_TAG = "parameters"
# The cell metadata key naming the report section a cell shows.
SECTION_KEY = "cutetune_section"


def report_notebook() -> nbformat.NotebookNode:
    """The report notebook as shipped, without outputs."""
    text = (resources.files("cutetune.report") / NOTEBOOK).read_text()
    return nbformat.reads(text, as_version=4)


def with_parameters(notebook: nbformat.NotebookNode, **values: object) -> nbformat.NotebookNode:
    """A copy of `notebook` with a cell setting `values` right after its `parameters` cell
    (papermill's convention: the defaults stay visible, the values used follow them)."""
    notebook = nbformat.from_dict(notebook)
    index = next(i for i, cell in enumerate(notebook.cells)
                 if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", ()))
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(index + 1, injected)
    return notebook


class ThisPython(KernelSpecManager):
    """Every kernel name means this Python with this cutetune on its path: a `python3` spec
    installed for another interpreter (a user's Jupyter, another venv) must not run the
    report against another cutetune, or none."""

    def get_kernel_spec(self, kernel_name: str, *args, **kwargs) -> KernelSpec:
        here = str(Path(__file__).resolve().parents[2])  # the folder holding cutetune/
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f",
                                "{connection_file}"],
                          display_name="cutetune report", language="python",
                          env={"PYTHONPATH": path})


def execute(notebook: nbformat.NotebookNode, on_section: Callable[[str], None] | None = None,
            timeout_s: int = 600) -> nbformat.NotebookNode:
    """Run every cell of `notebook` in a fresh kernel of this Python, in place; calls
    `on_section(key)` as each section's cell starts. A failing cell raises nbclient's
    CellExecutionError."""

    def started(cell, cell_index) -> None:
        key = cell.get("metadata", {}).get(SECTION_KEY)
        if key is not None and on_section is not None:
            on_section(key)

    manager = KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())
    client = NotebookClient(notebook, km=manager, timeout=timeout_s,
                            on_cell_start=started)
    client.execute()
    return notebook


def to_html(notebook: nbformat.NotebookNode) -> str:
    """The executed notebook as one HTML page: outputs only, the figures embedded as PNG."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_loaders=[DictLoader({"report.html.j2": _OFFLINE})],
                            template_file="report.html.j2", exclude_input=True,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(notebook)
    return body


# JupyterLab's page without the scripts it fetches from a CDN (require.js, MathJax, mermaid):
# the report has no widgets, formulas or diagrams, and a page read offline loads nothing.
_OFFLINE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
