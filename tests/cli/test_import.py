"""`cutetune import` of bad files through CliRunner: one line per refused row (file, row,
column, why), a count, a non-zero exit and nothing written, not even a new database file;
--skip-invalid stores the valid rows; duplicates are stored and counted once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutetune.cli.main import cli
from testkit.bad_imports import BAD_ROWS, export_text, spoiled, valid_records

TABLES = ("devices", "kernels", "problems", "tuning_runs", "tuning_trials", "winners")


def invoke(db_url: str, *args: str):
    return CliRunner().invoke(cli, ["--db", db_url, *args])


def counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as connection:
        return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in TABLES}


def assert_refused(result, path: Path, lines: list[str], fragment: str) -> None:
    """Non-zero exit, no traceback, each refusal on a line of its own, one error line."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    refusals = [line for line in result.stderr.splitlines() if line.startswith(f"{path}: row ")]
    assert len(refusals) == len(lines), result.output
    for refusal, expected in zip(refusals, lines, strict=True):
        assert refusal.startswith(expected), (refusal, expected)
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert fragment in error, error


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """A database holding the valid rows, imported."""
    path = tmp_path / "stored.db"
    source = tmp_path / "valid.json"
    source.write_text(export_text(valid_records(), "json"))
    result = invoke(f"sqlite:///{path}", "import", str(source))
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("bad", BAD_ROWS, ids=lambda bad: bad.name)
def test_a_file_with_an_invalid_row_is_refused_and_writes_nothing(bad, fmt, tmp_path, stored):
    if fmt == "csv" and bad.name == "missing-column":
        pytest.skip("a CSV row cannot lack a column its header has: the header is checked")
    path = tmp_path / f"bad.{fmt}"
    path.write_text(export_text(spoiled(bad), fmt))
    expected = [f"{path}: row 2: {bad.column(fmt)}: "]
    # Into a new database: refused before it is created.
    new = tmp_path / "new.db"
    result = invoke(f"sqlite:///{new}", "import", str(path))
    assert_refused(result, path, expected, f"{path}: 1 of 3 rows refused (above); nothing "
                                           "imported (--skip-invalid stores the valid ones)")
    assert bad.reason in result.stderr
    assert not new.exists()
    # Into one that holds winners: unchanged.
    before = counts(stored)
    assert_refused(invoke(f"sqlite:///{stored}", "import", str(path)), path, expected,
                   "1 of 3 rows refused")
    assert counts(stored) == before


def test_every_refused_row_gets_its_line_and_the_count_comes_last(tmp_path):
    records = [*valid_records(), *(spoiled(bad)[1] for bad in BAD_ROWS)]
    path = tmp_path / "bad.json"
    path.write_text(export_text(records, "json"))
    new = tmp_path / "new.db"
    result = invoke(f"sqlite:///{new}", "import", str(path))
    assert_refused(result, path,
                   [f"{path}: row {number}: {bad.field}: "
                    for number, bad in enumerate(BAD_ROWS, 3)],
                   f"{len(BAD_ROWS)} of {len(records)} rows refused")
    assert result.output.rstrip().splitlines()[-1].startswith("Error:")
    assert not new.exists()


def test_skip_invalid_stores_the_valid_rows_and_counts_the_refused(tmp_path):
    records = [*valid_records(), *(spoiled(bad)[1] for bad in BAD_ROWS[:4])]
    path = tmp_path / "mixed.json"
    path.write_text(export_text(records, "json"))
    target = tmp_path / "target.db"
    result = invoke(f"sqlite:///{target}", "import", str(path), "--skip-invalid")
    assert result.exit_code == 0, result.output
    refusals = [line for line in result.stderr.splitlines() if line.startswith(f"{path}: row")]
    assert [line.split(":")[1] for line in refusals] == [" row 3", " row 4", " row 5", " row 6"]
    assert f"imported 2 winners from {path}; 0 duplicate rows (stored once); 4 rows refused" \
        in result.stderr
    assert counts(target)["winners"] == 2


def test_skip_invalid_with_no_valid_row_is_refused_and_creates_nothing(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(export_text([spoiled(bad)[1] for bad in BAD_ROWS[:2]], "json"))
    new = tmp_path / "new.db"
    result = invoke(f"sqlite:///{new}", "import", str(path), "--skip-invalid")
    assert_refused(result, path, [f"{path}: row 1: ", f"{path}: row 2: "],
                   "all 2 rows refused (above); nothing imported")
    assert not new.exists()


def test_duplicate_rows_are_stored_and_counted_once(tmp_path):
    first, second = valid_records()
    path = tmp_path / "twice.csv"
    path.write_text(export_text([first, second, first, second, first], "csv"))
    target = tmp_path / "target.db"
    result = invoke(f"sqlite:///{target}", "import", str(path))
    assert result.exit_code == 0, result.output
    assert "imported 2 winners" in result.stderr and "3 duplicate rows (stored once)" \
        in result.stderr
    assert counts(target)["winners"] == counts(target)["tuning_runs"] == 2
