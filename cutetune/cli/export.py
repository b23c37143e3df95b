"""`cutetune export`: the stored winners as JSON or CSV, or with their runs, trials and ceilings
as a SQLite database file (`--format db`), which `cutetune import` reads into another."""

from __future__ import annotations

import click

from cutetune.cli.context import Context
from cutetune.cli.options import CATALOG_HELP, all_devices_option, dtype_option, kernel_filter


@click.command(epilog=CATALOG_HELP)
@click.option("--format", "fmt", type=click.Choice(["json", "csv", "db"]), required=True,
              help="json or csv: the winners; db: a SQLite file of the winners with the runs "
                   "that named them, every trial of those and their devices' ceilings "
                   "(needs --out)")
@kernel_filter
@click.option("--model", "-m", default=None,
              help="only the problems this model uses (preset name or HF config.json path)")
@dtype_option
@all_devices_option
@click.option("--current", is_flag=True,
              help="only winners measured with the installed kernels' code (their source hash)")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="file to write (default: standard output)")
@click.pass_obj
def export(obj: Context, fmt: str, kernel: str | None, model: str | None, dtype: str,
           all_devices: bool, current: bool, out: str | None) -> None:
    """Export the stored winners as JSON or CSV, or with their runs as a database file."""
    from cutetune.cli.files import check_output, write_output
    from cutetune.cli.options import fingerprint_or_none
    from cutetune.cli.problems import model_problems
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.results_db import export_winners

    names = [kernel] if kernel else kernel_names()
    # A kernel named with a model it does not serve is refused, as plan refuses it; of every
    # kernel, those the model does not use are skipped (said on stderr).
    problems = None if model is None else {
        (name, problem.static_key()) for name in names
        for problem in model_problems(get_kernel(name), model, dtype,
                                      skip_if_absent=kernel is None)}
    source_hashes = {name: get_kernel(name).source_hash() for name in names} if current else None
    if fmt == "db":
        if out is None:
            raise click.UsageError("--format db writes a database file: give --out FILE")
        check_output(out)
    db = obj.open_db()
    fingerprint = fingerprint_or_none(all_devices)
    if fmt == "db":
        _export_database(obj, db, out, fingerprint, kernel, problems, source_hashes)
        return
    with obj.reading():
        text = export_winners(db, fmt, fingerprint, kernel, problems, source_hashes)
    if out is None:
        click.echo(text, nl=False)
    else:
        write_output(out, text)


def _export_database(obj: Context, db, out: str, fingerprint, kernel: str | None,
                     problems, source_hashes) -> None:
    """The selected winners with their runs, trials and ceilings, copied into the SQLite file
    `out` (created, or added to without repeating what it holds)."""
    from pathlib import Path

    from cutetune.results_db import Database, copy_results

    def keep(key) -> bool:
        device, kernel_name, source_hash, static_key, _ = key
        return ((fingerprint is None or device == fingerprint)
                and (kernel is None or kernel_name == kernel)
                and (problems is None or (kernel_name, static_key) in problems)
                and (source_hashes is None or source_hashes.get(kernel_name) == source_hash))

    target = Database.open(f"sqlite:///{Path(out).resolve()}")
    try:
        with obj.reading():
            counts = copy_results(db, target, keep)
    finally:
        target.dispose()
    click.echo(f"exported {counts.runs} winners with their runs ({counts.trials} trials) and "
               f"{counts.ceilings} ceilings to {out}; {counts.duplicate_runs} runs and "
               f"{counts.duplicate_ceilings} ceilings it held already skipped", err=True)
