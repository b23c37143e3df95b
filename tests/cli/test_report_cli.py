"""`cutetune report` through CliRunner, on the committed H200 results (tests/data) and on an
empty database."""

from __future__ import annotations

import re
from html import unescape

from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.report.tables import SECTIONS
from cutetune.results_db import Database
from testkit.h200_results import H200_URL


def invoke(*args: str):
    return CliRunner().invoke(cli, ["report", *args])


def test_markdown_report_of_the_h200_results(tmp_path):
    out = tmp_path / "report.md"
    result = invoke("--model", "qwen3-8b", "--db", H200_URL, "--format", "md", "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# Tuning report: qwen3-8b on NVIDIA H200")
    assert "64 winners" in text and "1024 trials in 64 tuning runs" in text
    assert "| qk_norm | warps_per_block | 8 | 4 |" in text
    # One progress line per section on stderr, then where the report went.
    progress = [line for line in result.stderr.splitlines() if line.startswith("report: ")]
    assert progress == [f"report: {section.title}" for section in SECTIONS]
    assert result.stderr.rstrip().endswith(f"wrote {out}")


def test_markdown_to_standard_output_through_the_group_db_option(tmp_path):
    result = CliRunner().invoke(cli, ["--db", H200_URL, "report", "--model", "qwen3-30b-a3b",
                                      "--format", "md"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Tuning report: qwen3-30b-a3b on NVIDIA H200")
    assert "| moe_dispatch | form | replicated |" in result.stdout


def test_an_empty_database_gives_a_report_that_says_so(tmp_path):
    path = tmp_path / "empty.db"
    empty = f"sqlite:///{path}"
    Database.open(empty).dispose()
    before = path.read_bytes()
    result = invoke("--model", "qwen3-8b", "--db", empty, "--format", "md")
    assert result.exit_code == 0, result.output
    assert "Nothing is tuned for qwen3-8b in this database" in result.stdout
    assert "No device in the database" in result.stdout
    assert path.read_bytes() == before  # read, never changed
    html = tmp_path / "report.html"
    result = invoke("--model", "qwen3-8b", "--db", empty, "--out", str(html))
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    text = unescape(re.sub(r"<[^>]+>", "", page))  # the page as read, Markdown rendered
    assert "Nothing is tuned for qwen3-8b" in text
    assert all(section.empty.replace("`", "") in text for section in SECTIONS)
    progress = [line for line in result.stderr.splitlines() if line.startswith("report: ")]
    assert progress[1:] == [f"report: {section.title}" for section in SECTIONS]


def test_a_model_with_nothing_tuned():
    result = invoke("--model", "llama-3.1-70b", "--db", H200_URL, "--format", "md")
    assert result.exit_code == 0, result.output
    assert "Nothing is tuned for llama-3.1-70b in this database on this device" in result.stdout


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def test_bad_model_device_and_database(tmp_path):
    assert "unknown model 'nope'" in one_error_line(
        invoke("--model", "nope", "--db", H200_URL, "--format", "md"))
    assert "no device in the database is named like 'B200'" in one_error_line(
        invoke("--model", "qwen3-8b", "--db", H200_URL, "--device", "B200"))
    not_a_db = tmp_path / "text.db"
    not_a_db.write_text("not a database")
    # Refused at open, where the database's schema revision is read.
    assert "cannot open the database" in one_error_line(
        invoke("--model", "qwen3-8b", "--db", f"sqlite:///{not_a_db}", "--format", "md"))


def test_the_html_report_without_the_report_extra(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "nbclient" else real(name, *a))
    error = one_error_line(invoke("--model", "qwen3-8b", "--db", H200_URL,
                                  "--out", str(tmp_path / "r.html")))
    assert "the HTML report needs nbclient: pip install 'cutetune[report]'" in error
    assert not (tmp_path / "r.html").exists()
