"""`cutetune db`: the results database's own tables."""

from __future__ import annotations

import click

from cutetune.cli.context import Context


@click.group()
def db() -> None:
    """The results database's tables (Optuna's tables are Optuna's own)."""


@db.command()
@click.pass_obj
def upgrade(obj: Context) -> None:
    """Bring the database's tables to this cutetune's revision, keeping every row: what a
    command that writes does when it opens an older database. A database a newer cutetune
    wrote is refused."""
    from sqlalchemy import inspect

    from cutetune.results_db.migrate import unversioned_revision
    from cutetune.results_db.schema_version import HEAD, stored_revision

    found = obj.open_db()  # read as it is: a missing file or a newer revision is one line
    with obj.reading(), found.engine.connect() as connection:
        was = stored_revision(connection)
        if was is None:
            tables = set(inspect(connection).get_table_names())
            was = unversioned_revision(tables) if "winners" in tables else None
    found.dispose()
    obj.open_db(writable=True).dispose()
    if was == HEAD:
        click.echo(f"{obj.shown_url}: at revision {HEAD} already, nothing to do", err=True)
    else:
        click.echo(f"{obj.shown_url}: upgraded from revision {was or '(no tables)'} to {HEAD}",
                   err=True)
