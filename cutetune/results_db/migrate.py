"""Bringing a database's tables to the installed revision with Alembic (migrations/): a new
database gets the tables and the head revision's stamp; one written before cutetune versioned
its tables is stamped with the revision its tables show, then upgraded; one of an older
revision is upgraded; one of a newer revision is refused.

Imported only where the stored revision is not the installed one (schema_version.py): a
database at the head costs its opener one query and no Alembic import.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, inspect, text

from cutetune.results_db.schema import Base
from cutetune.results_db.schema_version import (
    HEAD,
    SCHEMA_LOCK_KEY,
    check_known,
    stored_revision,
)

_SCRIPTS = Path(__file__).parent / "migrations"


def bring_to_head(engine: Engine, shown_url: str) -> str | None:
    """Create or upgrade the database's tables to HEAD in one transaction, which tuners opening
    the same database at once take one at a time. Returns the revision the database was at
    (that of its tables where it recorded none), None for a database without cutetune's tables.
    Raises NewerSchemaError for a revision this cutetune does not know."""
    with engine.begin() as connection:
        _lock(connection)
        revision = stored_revision(connection)
        check_known(revision, shown_url)
        if revision == HEAD:  # another opener upgraded it while this one waited
            return revision
        config = Config()
        config.set_main_option("script_location", str(_SCRIPTS).replace("%", "%%"))
        config.attributes["connection"] = connection
        if revision is None:
            tables = set(inspect(connection).get_table_names())
            if "winners" not in tables:  # nothing of cutetune's here (Optuna's tables may be)
                Base.metadata.create_all(connection)
                command.stamp(config, HEAD)
                return None
            revision = unversioned_revision(tables)
            command.stamp(config, revision)
        command.upgrade(config, HEAD)
        return revision


def unversioned_revision(tables: set[str]) -> str:
    """The revision of a database written before cutetune versioned its tables, read from the
    tables it has: the quarantine arrived in 0002, the calibrations in 0003."""
    if "calibrations" in tables:
        return "0003"
    return "0002" if "quarantine" in tables else "0001"


def _lock(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
    else:  # SQLite: take the write lock now, not at the first write after the checks
        connection.exec_driver_sql("BEGIN IMMEDIATE")
