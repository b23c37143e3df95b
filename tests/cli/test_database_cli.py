"""The database a command is pointed at, when it is wrong (issue 41, bad input): a PostgreSQL
server that does not answer or refuses the password, a driver not installed, a database of a
newer cutetune, a read-only database; each is one line naming the URL with its password
masked, before any GPU work (the tuning run is never started), a non-zero exit, nothing
written. And `cutetune db upgrade`, which brings an older database to this revision."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from cutetune.cli.main import cli
from cutetune.results_db import Database, winners
from cutetune.results_db.schema_version import HEAD, VERSION_TABLE
from testkit.databases import NO_SERVER, postgres_server_url, scratch_url
from testkit.first_release_db import first_release_database

PASSWORD = "s3cret-pw"


@pytest.fixture
def tune_reaches_no_gpu(monkeypatch) -> list:
    """A GPU seems visible, and the tuning run (the first GPU work) is recorded, not run."""
    import torch

    from cutetune.tuner import model_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    runs: list = []
    monkeypatch.setattr(model_run, "tune_model", lambda *arguments: runs.append(arguments) or [])
    return runs


def tune(url: str):
    return CliRunner().invoke(cli, ["--db", url, "tune", "qk_norm", "--model", "qwen3-8b",
                                    "--tokens", "1"])


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def server_url(**changes) -> str:
    server = postgres_server_url()
    if server is None:
        pytest.skip(NO_SERVER)
    return make_url(server).set(**changes).render_as_string(hide_password=False)


def test_a_server_that_does_not_answer(tune_reaches_no_gpu):
    url = f"postgresql+psycopg://cutetune:{PASSWORD}@127.0.0.1:1/results"
    line = one_error_line(tune(url))
    assert "cannot write to the database postgresql+psycopg://cutetune:***@127.0.0.1:1/results"\
        in line and "refused" in line
    assert PASSWORD not in line
    assert tune_reaches_no_gpu == []


def test_a_wrong_password(tune_reaches_no_gpu):
    result = tune(server_url(password=PASSWORD))
    line = one_error_line(result)
    assert "password authentication failed" in line
    assert PASSWORD not in result.output
    assert tune_reaches_no_gpu == []


@pytest.mark.parametrize("driver", ["psycopg", "pg8000"])
def test_a_driver_not_installed(tune_reaches_no_gpu, monkeypatch, driver):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as where the extra is not installed
    result = tune(f"postgresql+{driver}://cutetune:{PASSWORD}@127.0.0.1/results")
    line = one_error_line(result)
    assert "needs a driver that is not installed" in line
    assert "pip install 'cutetune[postgresql]'" in line
    assert PASSWORD not in result.output
    assert tune_reaches_no_gpu == []


def test_a_database_of_a_newer_cutetune(tune_reaches_no_gpu, tmp_path):
    path = tmp_path / "newer.db"
    Database.open(f"sqlite:///{path}").dispose()
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    before = digest(path)
    line = one_error_line(tune(f"sqlite:///{path}"))
    assert "revision 9999, newer than this cutetune" in line
    assert digest(path) == before
    assert tune_reaches_no_gpu == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_read_only_database(tune_reaches_no_gpu, tmp_path, backend):
    if backend == "postgresql" and postgres_server_url() is None:
        pytest.skip(NO_SERVER)
    with scratch_url(backend, tmp_path) as url:
        Database.open(url).dispose()
        if backend == "sqlite":
            path = tmp_path / "results.db"
            before = digest(path)
            read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
        else:  # a session that may only read, as on a standby server
            parsed = make_url(url)
            read_only = parsed.update_query_dict({"options": parsed.query["options"] + (
                " -cdefault_transaction_read_only=on")}).render_as_string(hide_password=False)
        line = one_error_line(tune(read_only))
        assert "cannot write to the database" in line and "read" in line
        if backend == "sqlite":
            assert digest(path) == before
        else:
            assert make_url(url).password not in line
            assert winners(Database.open(url)) == []
    assert tune_reaches_no_gpu == []


def test_db_upgrade_brings_a_first_release_database_to_this_revision(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    first_release_database(url)
    runner = CliRunner()
    result = runner.invoke(cli, ["--db", url, "db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert f"upgraded from revision 0001 to {HEAD}" in result.output
    [winner] = winners(Database.open(url, read_only=True))
    assert winner.config_json == '{"warps_per_block": 4}'
    again = runner.invoke(cli, ["--db", url, "db", "upgrade"])
    assert again.exit_code == 0 and f"at revision {HEAD} already" in again.output
    missing = runner.invoke(cli, ["--db", f"sqlite:///{tmp_path / 'none.db'}", "db", "upgrade"])
    assert "no such file" in one_error_line(missing)
    assert not (tmp_path / "none.db").exists()
