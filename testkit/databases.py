"""The databases tests run against: a SQLite file always, and PostgreSQL where a server's URL
is given in POSTGRES_URL_ENV (.ci/run starts one and sets it). Each test gets a schema of its
own on the server, dropped afterwards, so tests running side by side (pytest-xdist) never see
each other's rows."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POSTGRES_URL_ENV = "CUTETUNE_TEST_POSTGRES_URL"
BACKENDS = ("sqlite", "postgresql")
NO_SERVER = (f"PostgreSQL: no server given; set {POSTGRES_URL_ENV} to one's URL "
             "(postgresql+psycopg://user:password@host:port/database; .ci/run starts one)")


def postgres_server_url() -> str | None:
    """The URL of the PostgreSQL server tests may use, where one is given."""
    return os.environ.get(POSTGRES_URL_ENV) or None


@contextmanager
def scratch_url(backend: str, directory: Path, name: str = "results",
                server: str | None = None) -> Iterator[str]:
    """A URL of an empty database on `backend`: a SQLite file in `directory`, or a schema of
    its own on the PostgreSQL server at `server` (by default POSTGRES_URL_ENV's), dropped at
    the end with whatever was written there."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / f'{name}.db'}"
        return
    server = server or postgres_server_url()
    if server is None:
        raise LookupError(NO_SERVER)
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"test_{name}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(server).update_query_dict({"options": f"-csearch_path={schema}"})
        try:
            yield url.render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
