"""`cutetune import`: the winners of an export file, each row checked as a tuned winner is."""

from __future__ import annotations

from pathlib import Path

import click

from cutetune.cli.context import Context


@click.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default=None,
              help="the file's format [default: from its suffix]")
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

    fmt = fmt or {".json": "json", ".csv": "csv"}.get(Path(path).suffix.lower())
    if fmt is None:
        raise click.BadParameter("cannot tell the format from the suffix: use --format",
                                 param_hint="PATH")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise click.BadParameter(f"cannot read {path}: {why}", param_hint="PATH") from None
    # Everything is checked before the database is opened, so a refused file creates nothing.
    try:
        checked = check_import(text, fmt, device_spec_for)
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
    db = obj.open_db(writable=True)
    stored = store_import(db, checked)
    click.echo(f"imported {stored} winners from {path}; {checked.duplicates} duplicate rows "
               f"(stored once); {refused} rows refused", err=True)
