"""Which revision of cutetune's tables a database holds, read without Alembic: opening a
database at the installed revision costs one query, and Alembic (migrate.py) is imported only
where there is something to do."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

# Alembic's version table, named for cutetune so that a shared database may hold another
# application's `alembic_version`.
VERSION_TABLE = "cutetune_schema_version"
# The revisions of migrations/versions/, oldest first (a test holds them to Alembic's).
REVISIONS = ("0001", "0002", "0003", "0004")
HEAD = REVISIONS[-1]
# The PostgreSQL advisory lock under which tables are created or migrated (cutetune's and
# Optuna's), so that tuners starting together on a new database create them once. Any key
# will do, if no other application of a shared database takes the same: "cutetune" as int64.
SCHEMA_LOCK_KEY = int.from_bytes(b"cutetune", "big") >> 1


class NewerSchemaError(ValueError):
    """The database was written by a newer cutetune: its tables may hold what this one would
    misread or overwrite."""


def stored_revision(connection: Connection) -> str | None:
    """The revision the database's version table records; None where it has none (an empty
    database, or one written before cutetune versioned its tables)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def check_known(revision: str | None, shown_url: str) -> None:
    """Raise NewerSchemaError where `revision` is none this cutetune knows."""
    if revision is not None and revision not in REVISIONS:
        raise NewerSchemaError(
            f"the database {shown_url} has cutetune schema revision {revision}, newer than "
            f"this cutetune knows (up to {HEAD}): upgrade cutetune to use it")
