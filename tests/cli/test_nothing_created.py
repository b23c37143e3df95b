"""A failing or mistaken command creates nothing (issue 36, item 3): no database, directory or
cache entry; a command that only reads refuses a database that is not there (a missing file, a
directory, an empty or in-memory URL) in one line instead of reading it as empty; `~` in a
SQLite URL is the home directory.

HOME is a temporary folder and the working directory another, with no CUTETUNE_* setting, so
the default database and cache are under the temporary HOME and every file a command could
create lands under tmp_path, which is compared before and after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.results_db import Database, winners
from cutetune.settings import load_settings
from testkit.bad_imports import export_text, valid_records

NO_SUCH_FILE = "no such file (run cutetune tune first, or give --db)"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh HOME (the default database's and cache's place) and working directory."""
    for name in ("CUTETUNE_DB", "CUTETUNE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "bad.json").write_text('[{"kernel_name": "nosuch"}]')
    (work / "not-json.json").write_text("{")
    (work / "empty.json").write_text("[]")
    (work / "a-directory.db").mkdir()
    return home


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def one_error_line(result) -> str:
    """The one `Error:` line of a failed command (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def default_db() -> str:
    return f"sqlite:///{Path.home() / '.cache' / 'cutetune' / 'cutetune.db'}"


# Each: the arguments (`{tmp}` is tmp_path) and what its one error line says. A command that
# only reads names the database it could not open; the others stop before creating anything.
FAILING_COMMANDS = [
    ("import-refused-rows", ["--db", "sqlite:///{tmp}/new/x.db", "import", "bad.json"],
     "nothing imported"),
    ("import-not-json", ["--db", "sqlite:///{tmp}/new/x.db", "import", "not-json.json"],
     "not-json.json"),
    ("import-default-db", ["import", "bad.json"], "nothing imported"),
    ("import-empty-file", ["--db", "sqlite:///{tmp}/new/x.db", "import", "empty.json"],
     "empty.json: no winners in it; nothing imported"),
    ("cache-build-unknown-model", ["cache", "build", "--model", "nosuch"],
     "unknown model 'nosuch'"),
    ("cache-build-missing-db", ["--db", "sqlite:///{tmp}/new/x.db", "cache", "build",
                                "--model", "qwen3-8b"], NO_SUCH_FILE),
    ("tune-unknown-model", ["tune", "--model", "nosuch"], "unknown model 'nosuch'"),
    ("tune-unknown-kernel", ["tune", "nosuch", "--model", "qwen3-8b"], "unknown kernel"),
    ("tune-db-is-a-directory", ["--db", "sqlite:///a-directory.db", "tune", "qk_norm",
                                "--model", "nosuch"], "unknown model 'nosuch'"),
    ("plan-unknown-model", ["plan", "qk_norm", "--model", "nosuch"], "unknown model"),
    ("bench-unknown-model", ["bench", "qk_norm", "--model", "nosuch"], "unknown model"),
    ("show-missing-file", ["--db", "sqlite:///{tmp}/new/x.db", "show"],
     f"cannot open the database sqlite:///{{tmp}}/new/x.db: {NO_SUCH_FILE}"),
    ("show-failed-missing-file", ["--db", "sqlite:///{tmp}/x.db", "show", "--failed"],
     f"cannot open the database sqlite:///{{tmp}}/x.db: {NO_SUCH_FILE}"),
    ("show-relative-missing-file", ["--db", "sqlite:///x.db", "show"],
     f"cannot open the database sqlite:///x.db: {NO_SUCH_FILE}"),
    ("show-default-db", ["show"], NO_SUCH_FILE),
    ("show-home-db", ["--db", "sqlite:///~/x.db", "show"],
     f"cannot open the database sqlite:///~/x.db: {NO_SUCH_FILE}"),
    ("show-directory", ["--db", "sqlite:///a-directory.db", "show"],
     "a-directory.db is a directory"),
    ("show-empty-url", ["--db", "", "show"], "the database URL is empty"),
    ("show-in-memory", ["--db", "sqlite://", "show"], "in-memory database holds nothing"),
    ("export-missing-file", ["--db", "sqlite:///{tmp}/x.db", "export", "--format", "json"],
     NO_SUCH_FILE),
    ("export-default-db", ["export", "--format", "csv", "--out", "w.csv"], NO_SUCH_FILE),
    ("export-directory", ["--db", "sqlite:///a-directory.db", "export", "--format", "json"],
     "is a directory"),
    ("export-empty-url", ["--db", "", "export", "--format", "json"], "URL is empty"),
    ("export-kernel-not-in-model", ["export", "--format", "json", "--out", "w.json", "--model",
                                    "mixtral-8x7b", "--kernel", "qk_norm"],
     "model mixtral-8x7b does not normalise q and k per head"),
    ("report-missing-file", ["report", "--model", "qwen3-8b", "--format", "md",
                             "--db", "sqlite:///{tmp}/x.db"], NO_SUCH_FILE),
    ("report-default-db", ["report", "--model", "qwen3-8b", "--format", "md"], NO_SUCH_FILE),
    ("report-directory", ["report", "--model", "qwen3-8b", "--db", "sqlite:///a-directory.db"],
     "is a directory"),
    ("report-empty-url", ["report", "--model", "qwen3-8b", "--db", ""], "URL is empty"),
    ("calibrate-missing-file", ["--db", "sqlite:///{tmp}/new/x.db", "calibrate"],
     f"cannot open the database sqlite:///{{tmp}}/new/x.db: {NO_SUCH_FILE}"),
    ("calibrate-default-db", ["calibrate"], NO_SUCH_FILE),
]


@pytest.mark.parametrize(("args", "expected"), [case[1:] for case in FAILING_COMMANDS],
                         ids=[case[0] for case in FAILING_COMMANDS])
def test_a_failing_command_is_one_line_and_creates_nothing(home, tmp_path, args, expected):
    before = tree(tmp_path)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    result = CliRunner().invoke(cli, args)
    error = one_error_line(result)
    assert expected.replace("{tmp}", str(tmp_path)) in error
    # Nothing printed as if the command had worked, nor any note before the error but what
    # it points to (import's refused rows, "above").
    assert result.stdout == ""
    notes = [line for line in result.stderr.splitlines()
             if line and not line.startswith(("Usage:", "Try ", "Error:"))]
    assert notes == [] or "(above)" in error
    assert tree(tmp_path) == before


def test_the_default_database_is_named_when_it_is_missing(home):
    error = one_error_line(CliRunner().invoke(cli, ["show"]))
    assert f"cannot open the database {default_db()}: {NO_SUCH_FILE}" in error


def test_cache_build_without_a_default_database_builds_the_shipped_winners(home, monkeypatch):
    """A build host that never tuned has no database at the default path: cache build says so
    and goes on (only a database someone named must exist); stopped here at the compiler
    check, it has still created nothing."""
    monkeypatch.setenv("CC", str(home / "no-such-compiler"))
    result = CliRunner().invoke(cli, ["cache", "build", "--model", "qwen3-8b"])
    assert "no C compiler found" in one_error_line(result)
    assert (f"no results database at {default_db()}: building the shipped winners and the "
            "defaults") in result.stderr
    assert not any(home.iterdir())


# -- `~` --------------------------------------------------------------------------------------


def test_a_home_relative_sqlite_url_is_under_home(home, tmp_path):
    (tmp_path / "good.json").write_text(export_text(valid_records(), "json"))
    result = CliRunner().invoke(cli, ["--db", "sqlite:///~/dbs/x.db", "import",
                                      str(tmp_path / "good.json")])
    assert result.exit_code == 0, result.output
    assert (home / "dbs" / "x.db").is_file()
    assert not any(path.name == "~" for path in tmp_path.rglob("*"))
    shown = CliRunner().invoke(cli, ["--db", "sqlite:///~/dbs/x.db", "show", "--all-devices"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("qk_norm") == len(valid_records())


def test_cutetune_db_and_cache_dir_expand_home(home, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTETUNE_DB", "sqlite:///~/from-env.db")
    Database.open(load_settings().db_url).dispose()
    assert (home / "from-env.db").is_file()
    assert winners(Database.open("sqlite:///~/from-env.db", read_only=True)) == []
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", "~/cache")
    assert load_settings().cache_dir == home / "cache"
    monkeypatch.delenv("CUTETUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert load_settings().cache_dir == home / "xdg" / "cutetune"
    assert not any(path.name == "~" for path in tmp_path.rglob("*"))


# -- the session layer ------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "read_only", "expected"), [
    ("", False, "the database URL is empty"),
    ("  ", True, "the database URL is empty"),
    ("sqlite:///{tmp}/none.db", True, "no such file"),
    ("sqlite://", True, "in-memory database holds nothing to read"),
    ("sqlite:///:memory:", True, "in-memory database holds nothing to read"),
    ("sqlite:///{tmp}", True, "is a directory"),
    ("sqlite:///{tmp}", False, "is a directory"),
], ids=["empty", "blank", "missing", "in-memory", "memory-path", "directory-read",
        "directory-write"])
def test_opening_what_is_no_database_raises_one_line(tmp_path, url, read_only, expected):
    before = tree(tmp_path)
    with pytest.raises(ValueError) as raised:
        Database.open(url.replace("{tmp}", str(tmp_path)), read_only=read_only)
    assert expected in str(raised.value) and "\n" not in str(raised.value)
    assert tree(tmp_path) == before
