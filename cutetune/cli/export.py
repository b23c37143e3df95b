"""`cutetune export`: the stored winners as JSON or CSV."""

from __future__ import annotations

import click

from cutetune.cli.context import Context
from cutetune.cli.options import CATALOG_HELP, all_devices_option, dtype_option, kernel_filter


@click.command(epilog=CATALOG_HELP)
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), required=True)
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
    """Export the stored winners as JSON or CSV."""
    from cutetune.cli.files import write_output
    from cutetune.cli.options import fingerprint_or_none
    from cutetune.cli.problems import model_problems
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.results_db import export_winners

    names = [kernel] if kernel else kernel_names()
    problems = None if model is None else {
        (name, problem.static_key()) for name in names
        for problem in model_problems(get_kernel(name), model, dtype, skip_if_absent=True)}
    source_hashes = {name: get_kernel(name).source_hash() for name in names} if current else None
    db = obj.open_db()
    with obj.reading():
        text = export_winners(db, fmt, fingerprint_or_none(all_devices), kernel, problems,
                              source_hashes)
    if out is None:
        click.echo(text, nl=False)
    else:
        write_output(out, text)
