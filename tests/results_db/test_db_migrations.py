"""The tables' revisions (Alembic): a database of cutetune's first release (the committed DDL of
tests/data/results_db_0001/, with rows written as that release wrote them) is upgraded at open
with nothing lost; one cutetune wrote before it versioned its tables is stamped and upgraded;
a newer revision is refused in one line, nothing written; and the migrations build exactly the
tables schema.py declares."""

from __future__ import annotations

import shutil

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from cutetune.results_db import (
    Database,
    QuarantinedPoint,
    record_quarantine,
    record_tuning_result,
    winners,
)
from cutetune.results_db.migrate import _SCRIPTS, unversioned_revision
from cutetune.results_db.schema import Base
from cutetune.results_db.schema_version import (
    HEAD,
    REVISIONS,
    VERSION_TABLE,
    NewerSchemaError,
    stored_revision,
)
from testkit.first_release_db import first_release_database, run_script
from testkit.h200_results import H200_RESULTS


def schema_differences(db: Database) -> list:
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return compare_metadata(context, Base.metadata)


def test_a_first_release_database_is_upgraded_at_open_with_nothing_lost(database_url, h200,
                                                                        make_result):
    first_release_database(database_url)
    db = Database.open(database_url)
    try:
        with db.engine.connect() as connection:
            assert stored_revision(connection) == HEAD
        [winner] = winners(db)
        assert (winner.kernel_name, winner.source_hash, winner.static_key, winner.bucket,
                winner.config_json, winner.median_us, winner.pct_roofline) == (
            "qk_norm", "5f1e0c", '{"head_dim": 128}', 16, '{"warps_per_block": 4}', 2.0, 47.5)
        assert winner.updated_at.isoformat() == "2026-01-05T12:03:00+00:00"
        # Every table takes new rows, those of the later revisions too.
        record_tuning_result(db, h200, make_result(source_hash="a0b1c2"))
        assert len(winners(db)) == 2
        record_quarantine(db, h200, QuarantinedPoint("qk_norm", "5f1e0c", '{"head_dim": 128}',
                                                     '{"warps_per_block": 1}', 16, "hang",
                                                     winner.updated_at))
        assert schema_differences(db) == []
    finally:
        db.dispose()


def test_the_migrations_build_the_tables_schema_py_declares(database_url):
    db = Database.open(database_url)  # a new database: schema.py's tables, stamped HEAD
    try:
        assert schema_differences(db) == []
    finally:
        db.dispose()
    run_script(database_url, f"DROP TABLE {VERSION_TABLE}")
    for table in reversed(Base.metadata.sorted_tables):
        run_script(database_url, f"DROP TABLE {table.name}")
    first_release_database(database_url)
    db = Database.open(database_url)  # the same tables, by the migrations alone
    try:
        assert schema_differences(db) == []
    finally:
        db.dispose()


def test_a_database_written_before_the_tables_were_versioned_is_stamped_and_upgraded(tmp_path):
    path = tmp_path / "h200.db"
    shutil.copy(H200_RESULTS, path)  # written by cutetune with the quarantine, unversioned
    before = create_engine(f"sqlite:///{path}")
    with before.connect() as connection:
        count = connection.execute(text("SELECT COUNT(*) FROM tuning_trials")).scalar()
    before.dispose()
    db = Database.open(f"sqlite:///{path}")
    try:
        with db.engine.connect() as connection:
            assert stored_revision(connection) == HEAD
            assert connection.execute(text("SELECT COUNT(*) FROM tuning_trials")).scalar() == count
        assert "bucket_claims" in inspect(db.engine).get_table_names()
        assert schema_differences(db) == []
    finally:
        db.dispose()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_newer_revision_is_refused_in_one_line_nothing_written(database_url, read_only):
    Database.open(database_url).dispose()
    run_script(database_url, f"UPDATE {VERSION_TABLE} SET version_num = '9999'; "
                             "DROP TABLE bucket_claims")
    with pytest.raises(NewerSchemaError) as refused:
        Database.open(database_url, read_only=read_only)
    message = str(refused.value)
    assert "\n" not in message and "revision 9999, newer than this cutetune" in message
    assert "upgrade cutetune" in message
    engine = create_engine(database_url)
    try:
        assert "bucket_claims" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_the_revisions_are_alembics_in_order():
    script = ScriptDirectory(str(_SCRIPTS))
    assert tuple(reversed([r.revision for r in script.walk_revisions()])) == REVISIONS
    assert script.get_current_head() == HEAD


def test_a_database_of_the_calibrations_but_no_claims_is_stamped_0003_and_upgraded(
        database_url):
    # As the last cutetune before the versioned tables created them (schema.py's create_all).
    engine = create_engine(database_url)
    Base.metadata.create_all(engine, tables=[t for t in Base.metadata.sorted_tables
                                             if t.name != "bucket_claims"])
    engine.dispose()
    db = Database.open(database_url)
    try:
        with db.engine.connect() as connection:
            assert stored_revision(connection) == HEAD
        assert unversioned_revision({"winners", "quarantine", "calibrations"}) == "0003"
        assert schema_differences(db) == []
    finally:
        db.dispose()
