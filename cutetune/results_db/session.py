"""Opening the results database from a URL, and the one session scope helper."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from cutetune.results_db.dialects import BACKENDS
from cutetune.results_db.schema import KernelRow
from cutetune.results_db.schema_version import HEAD, check_known, stored_revision

CONNECT_TIMEOUT_S = 10
SQLITE_BUSY_TIMEOUT_S = 30


class Database:
    """A results database: an engine, its tables, and transactional sessions over it."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine
        self._sessions = sessionmaker(engine)

    @property
    def shown_url(self) -> str:
        """The URL with its password masked: the one to put in messages."""
        return shown_url(self.url)

    @classmethod
    def open(cls, url: str, read_only: bool = False) -> Database:
        """Open (and create, where missing) the database at a SQLAlchemy URL, its tables
        brought to the installed revision (migrate.py; a read-only database is read as it is).

        SQLite and PostgreSQL are supported. A SQLite path may start with `~` (the home
        directory); its file gets its parent directory created. `read_only` creates and changes
        nothing: a SQLite file is opened read-only, and one that does not exist (or an
        in-memory database, which holds nothing to read) raises MissingDatabaseError. Raises
        ValueError, naming the URL (password masked), when it is empty or malformed, names an
        unsupported backend or driver, or a SQLite path that is a directory; NewerSchemaError (a
        ValueError) where a newer cutetune wrote it; a server that cannot be reached or a file
        that is no database raise SQLAlchemy's DatabaseError.
        """
        shown = shown_url(url)
        if not url.strip():
            raise ValueError("the database URL is empty: give a SQLAlchemy URL such as "
                             "sqlite:///cutetune.db")
        try:
            parsed = make_url(url)
            if parsed.get_backend_name() not in BACKENDS:
                raise ValueError(
                    f"unsupported database URL {shown!r}: the backend must be one of "
                    f"{', '.join(BACKENDS)}"
                )
            if parsed.get_backend_name() == "sqlite":
                parsed = _checked_sqlite(parsed, shown, read_only)
            engine = create_engine(parsed, connect_args=_connect_args(parsed))
        except (ArgumentError, NoSuchModuleError) as exc:
            raise ValueError(f"invalid database URL {shown!r}: {exc}") from None
        except ImportError as exc:  # the URL's driver (e.g. psycopg) is not installed
            hint = (" (pip install 'cutetune[postgresql]' installs psycopg)"
                    if url.lstrip().startswith("postgresql") else "")
            raise ValueError(f"database URL {shown!r} needs a driver that is not installed: "
                             f"{exc}{hint}") from None
        if engine.dialect.name == "sqlite":
            try:
                _prepare_sqlite(engine)
            except OSError as exc:
                raise ValueError(f"cannot create the directory of database {shown!r}: "
                                 f"{exc.strerror}") from None
        with engine.connect() as connection:
            revision = stored_revision(connection)
        check_known(revision, shown)
        if not read_only and revision != HEAD:
            from cutetune.results_db.migrate import bring_to_head

            bring_to_head(engine, shown)
        return cls(url, engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any exception."""
        with self._sessions.begin() as session:
            yield session

    def check_writable(self) -> None:
        """Raise the backend's error (sqlalchemy.exc.DatabaseError) now if the database does not
        take writes (a read-only file, a user without insert rights); writes nothing."""
        with self.engine.connect() as connection:
            connection.execute(insert(KernelRow).values(name="", source_hash=""))
            connection.rollback()

    def dispose(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()


def shown_url(url: str) -> str:
    """`url` with its password masked, for messages; unparsable text as it is."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


class MissingDatabaseError(ValueError):
    """A database opened only to read holds nothing because there is none: no file at a SQLite
    URL's path, or an in-memory database. Reading it as empty would hide a mistyped path."""


def _checked_sqlite(url: URL, shown: str, read_only: bool) -> URL:
    """A SQLite URL with `~` expanded in its path, read-only where asked (the file opened in
    SQLite's read-only mode); ValueError where the path is a directory, MissingDatabaseError
    where a read-only database does not exist."""
    database = url.database
    if database and database.startswith("file:"):  # a SQLite URI: SQLite reads it as it is
        return url
    if not database or database == ":memory:":
        if read_only:
            raise MissingDatabaseError(f"cannot open the database {shown}: an in-memory "
                                       "database holds nothing to read")
        return url
    path = Path(database).expanduser()
    if path.is_dir():
        raise ValueError(f"cannot open the database {shown}: {path} is a directory")
    if not read_only:
        return url.set(database=str(path))
    if not path.is_file():
        raise MissingDatabaseError(f"cannot open the database {shown}: no such file")
    return url.set(database=f"file:{path.resolve()}?mode=ro",
                   query={**url.query, "uri": "true"})


def _connect_args(url: URL) -> dict[str, Any]:
    """A server that does not answer is an error after CONNECT_TIMEOUT_S, not a hang (a
    connect_timeout in the URL wins); a SQLite file another process is writing is waited for
    up to SQLITE_BUSY_TIMEOUT_S, as tuners sharing one file do."""
    if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    if url.get_backend_name() == "sqlite" and "timeout" not in url.query:
        return {"timeout": SQLITE_BUSY_TIMEOUT_S}
    return {}


def _prepare_sqlite(engine: Engine) -> None:
    database = engine.url.database
    # In-memory databases have no file; "file:" names are SQLite URIs, not paths.
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)

    # SQLite leaves foreign keys unenforced unless each connection asks for them.
    @event.listens_for(engine, "connect")
    def _enable_foreign_keys(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
