"""`cutetune import`: the winners of an export file, each row checked as a tuned winner is; from
a database file (`cutetune export --format db`), with their runs, trials and ceilings."""

from __future__ import annotations

from pathlib import Path

import click

from cutetune.cli.context import Context


@click.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["json", "csv", "db"]), default=None,
              help="the file's format (db: a SQLite file of `export --format db`) [default: "
                   "from its suffix, .db or .sqlite for db]")
@click.option("--skip-invalid", is_flag=True,
              help="store the valid rows of a file that has invalid ones (each refused row is "
                   "still named) [default: a file with any invalid row stores nothing]")
@click.pass_obj
def import_(obj: Context, path: str, fmt: str | None, skip_invalid: bool) -> None:
    """Store the winners of a `cutetune export` file (served only on the GPU each was
    measured on), each row checked as a freshly tuned winner is; all or nothing unless
    --skip-invalid."""
    from cutetune.device.specs import device_spec_for
    from cutetune.results_db import check_import, store_import

    fmt = fmt or {".json": "json", ".csv": "csv", ".db": "db", ".sqlite": "db"}.get(
        Path(path).suffix.lower())
    if fmt is None:
        raise click.BadParameter("cannot tell the format from the suffix: use --format",
                                 param_hint="PATH")
    source = _opened_file(path) if fmt == "db" else None
    try:
        text = Path(path).read_text() if source is None else _winners_text(source, path)
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise click.BadParameter(f"cannot read {path}: {why}", param_hint="PATH") from None
    # Everything is checked before the database is opened, so a refused file creates nothing.
    try:
        checked = check_import(text, "json" if source is not None else fmt, device_spec_for)
    except ValueError as err:
        raise click.UsageError(f"{path}: {err}") from None
    for refusal in checked.refused:
        click.echo(f"{path}: {refusal}", err=True)
    refused = len(checked.refused)
    if refused and not skip_invalid:
        raise click.UsageError(f"{path}: {refused} of {checked.rows} rows refused (above); "
                               "nothing imported (--skip-invalid stores the valid ones)")
    if refused and not checked.runs:
        raise click.UsageError(f"{path}: all {checked.rows} rows refused (above); nothing "
                               "imported")
    if not checked.rows:  # an empty export, say: no database is created for nothing
        raise click.UsageError(f"{path}: no winners in it; nothing imported")
    db = obj.open_db(writable=True)
    if source is not None:
        _copy_runs(source, db, checked, path)
        return
    stored = store_import(db, checked)
    click.echo(f"imported {stored} winners from {path}; {checked.duplicates} duplicate rows "
               f"(stored once); {refused} rows refused", err=True)


def _opened_file(path: str):
    """The results database of a file, read-only; one line where it is none."""
    from sqlalchemy.exc import DatabaseError

    from cutetune.results_db import Database

    try:
        return Database.open(f"sqlite:///{Path(path).resolve()}", read_only=True)
    except (ValueError, DatabaseError) as err:
        why = str(getattr(err, "orig", err)).splitlines()[0]
        raise click.BadParameter(f"cannot read {path}: {why}", param_hint="PATH") from None


def _winners_text(source, path: str) -> str:
    """The winners of a database file as a JSON export, to be checked as any import is."""
    from sqlalchemy.exc import DatabaseError

    from cutetune.results_db import export_winners

    try:
        return export_winners(source, "json")
    except DatabaseError as err:
        raise click.BadParameter(f"cannot read {path}: it holds no cutetune results "
                                 f"({str(err.orig).splitlines()[0]})", param_hint="PATH") from None


def _copy_runs(source, db, checked, path: str) -> None:
    """The runs, trials and ceilings of the winners that passed the checks, copied."""
    from cutetune.results_db import copy_results

    accepted = {(device, run.kernel_name, run.source_hash, run.static_key, run.bucket)
                for device, run in checked.runs}
    try:
        counts = copy_results(source, db, accepted.__contains__)
    finally:
        source.dispose()
    click.echo(f"imported {counts.runs} winners with their runs ({counts.trials} trials) and "
               f"{counts.ceilings} ceilings from {path}; {counts.duplicate_runs} runs and "
               f"{counts.duplicate_ceilings} ceilings held already skipped; "
               f"{len(checked.refused)} winners refused", err=True)
