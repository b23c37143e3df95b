"""`cutetune show`: the stored winners, or the quarantined points, as a table."""

from __future__ import annotations

from datetime import datetime

import click

from cutetune.cli.context import Context
from cutetune.cli.options import KERNELS_HELP, all_devices_option, kernel_filter


@click.command(epilog=KERNELS_HELP)
@kernel_filter
@all_devices_option
@click.option("--failed", is_flag=True,
              help="the quarantined points (they hung or crashed a worker) and why, instead")
@click.pass_obj
def show(obj: Context, kernel: str | None, all_devices: bool, failed: bool) -> None:
    """Print the stored winners (or the quarantined points) as a table."""
    from dataclasses import asdict

    from cutetune.cli.options import fingerprint_or_none
    from cutetune.results_db import quarantined_points, winners_with_devices

    db, fingerprint = obj.open_db(), fingerprint_or_none(all_devices)
    with obj.reading():
        if failed:
            records = [{"kernel": p.kernel_name, "problem": p.static_key, "bucket": p.bucket,
                        "config": p.config_json, "reason": p.reason,
                        "gpu_name": device.gpu_name, "recorded_at": p.recorded_at}
                       for device, p in quarantined_points(db, fingerprint, kernel)]
            what = "no quarantined points"
        else:
            records = [{**asdict(winner), "gpu_name": device.gpu_name}
                       for device, winner in winners_with_devices(db, fingerprint, kernel)]
            what = "no winners stored"
    if not records:
        click.echo(what + (f" for {kernel}" if kernel else ""))
        return
    from cutetune.cli.table import render_table

    numbers = {name for record in records for name, value in record.items()
               if isinstance(value, int | float)}
    click.echo(render_table(list(records[0]), ([_cell(v) for v in r.values()] for r in records),
                            right=numbers))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)
