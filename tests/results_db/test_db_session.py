"""Opening a results database from a URL, and the transaction scope of its sessions."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import func, inspect, select
from sqlalchemy.exc import IntegrityError, StatementError

from cutetune.results_db import Database
from cutetune.results_db.schema import Base, CeilingRow, KernelRow, TrialRow
from cutetune.results_db.schema_version import VERSION_TABLE


def test_open_creates_the_sqlite_directory_and_every_table(tmp_path):
    path = tmp_path / "not" / "yet" / "there" / "cutetune.db"
    db = Database.open(f"sqlite:///{path}")
    try:
        assert path.is_file()
        assert set(inspect(db.engine).get_table_names()) == {*Base.metadata.tables,
                                                             VERSION_TABLE}
        assert db.url == f"sqlite:///{path}"
    finally:
        db.dispose()


def test_reopening_keeps_what_was_written(tmp_path):
    url = f"sqlite:///{tmp_path / 'cutetune.db'}"
    first = Database.open(url)
    with first.session() as session:
        session.add(KernelRow(name="qk_norm", source_hash="5f1e0c"))
    first.dispose()
    second = Database.open(url)
    try:
        with second.session() as session:
            assert session.scalars(select(KernelRow.name)).all() == ["qk_norm"]
    finally:
        second.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "nosuchdb://host/db",
        "mysql://user@host/db",
        "postgresql+nosuchdriver://host/db",
    ],
)
def test_bad_url_raises_one_line_naming_it(url):
    with pytest.raises(ValueError) as raised:
        Database.open(url)
    message = str(raised.value)
    assert repr(url) in message
    assert "\n" not in message


def test_unsupported_backend_lists_the_supported_ones():
    with pytest.raises(ValueError, match="the backend must be one of postgresql, sqlite"):
        Database.open("mysql://user@host/db")


def test_session_commits_on_success(db):
    with db.session() as session:
        session.add(KernelRow(name="qk_norm", source_hash="5f1e0c"))
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(KernelRow)) == 1


def test_session_rolls_back_on_exception(db):
    with pytest.raises(RuntimeError, match="interrupted"):
        with db.session() as session:
            session.add(KernelRow(name="qk_norm", source_hash="5f1e0c"))
            session.flush()
            raise RuntimeError("interrupted")
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(KernelRow)) == 0


def test_foreign_keys_are_enforced(db):
    with pytest.raises(IntegrityError):
        with db.session() as session:
            session.add(
                TrialRow(
                    run_id=12345,
                    number=0,
                    config_json="{}",
                    status="failed",
                    failure_reason="no such run",
                )
            )


def test_naive_timestamps_are_refused(db):
    with pytest.raises(StatementError, match="naive datetime .* cannot be stored"):
        with db.session() as session:
            session.add(
                CeilingRow(
                    device_id=1,
                    name="copy_gbps",
                    value=4200.0,
                    measured_at=datetime(2026, 1, 5, 12, 0),
                )
            )
