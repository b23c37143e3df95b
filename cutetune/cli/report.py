"""`cutetune report`: one model's tuning results from the database, as HTML or Markdown."""

from __future__ import annotations

import click

from cutetune.cli.context import Context
from cutetune.cli.options import PRESETS_HELP, db_option, device_option, dtype_option, model_option

# The packages of the `report` extra, which the HTML report needs (the Markdown one does not).
REPORT_PACKAGES = ("matplotlib", "nbformat", "nbclient", "ipykernel", "nbconvert")


@click.command(epilog=PRESETS_HELP)
@model_option
@dtype_option
@db_option
@device_option("the device to report on [default: the one with the most winners for the "
               "model]", default=None)
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default="html",
              show_default=True,
              help="html: the report notebook run headless, figures embedded; md: its tables")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="file to write [default: report.html; the Markdown on standard output]")
@click.pass_obj
def report(obj: Context, model: str, dtype: str, device, fmt: str, out: str | None) -> None:
    """Report one model's tuning results from the database: the devices and their ceilings,
    which buckets are tuned, the bench rows against the peers, the winners' configurations,
    the searches, the roofline's predictions and the failures."""
    from cutetune.cli.files import check_output, write_output
    from cutetune.report.data import devices_named, load_report_data, model_problems
    from cutetune.results_db import devices_frame
    from cutetune.spaces.models import UnknownModelError

    device_name = device.name if device is not None else None
    try:
        model_problems(model, dtype)
    except UnknownModelError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    # A bad URL, an unreadable file or a device not in the database is one line, before any
    # work.
    db = obj.open_db()
    try:
        with obj.reading():
            devices_named(devices_frame(db), device_name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--device") from None
    finally:
        db.dispose()
    if fmt == "html":
        from importlib.util import find_spec

        missing = [name for name in REPORT_PACKAGES if find_spec(name) is None]
        if missing:
            raise click.UsageError(f"the HTML report needs {', '.join(missing)}: pip install "
                                   "'cutetune[report]' (--format md needs none of them)")
    out = out or ("report.html" if fmt == "html" else None)
    if out:
        check_output(out)
    if fmt == "md":
        from cutetune.report.markdown import render_markdown

        with obj.reading():
            data = load_report_data(obj.db_url, model, device_name, dtype)
        text = render_markdown(data, on_section=lambda s: click.echo(f"report: {s.title}",
                                                                      err=True))
    else:
        text = _report_html(obj.db_url, model, device_name, dtype)
    if out is None:
        click.echo(text, nl=False)
    else:
        write_output(out, text)


def _report_html(db_url: str, model: str, device: str | None, dtype: str) -> str:
    """The report notebook, run headless with these parameters, as one HTML page."""
    from nbclient.exceptions import CellExecutionError

    from cutetune.report.notebook import execute, report_notebook, to_html, with_parameters
    from cutetune.report.tables import section

    notebook = with_parameters(report_notebook(), db_url=db_url, model=model, device=device,
                               dtype=dtype)
    click.echo("report: starting the notebook's kernel and reading the database ...", err=True)
    try:
        execute(notebook, on_section=lambda key: click.echo(f"report: {section(key).title}",
                                                             err=True))
    except CellExecutionError as err:
        raise click.ClickException(f"the report notebook failed: {err.ename}: "
                                   f"{err.evalue}") from None
    return to_html(notebook)
