"""`cutetune show`: the stored winners, or the quarantined points, as a table."""

from __future__ import annotations

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
    import pandas as pd

    from cutetune.cli.options import fingerprint_or_none
    from cutetune.results_db import quarantined_points, winners_frame

    db, fingerprint = obj.open_db(), fingerprint_or_none(all_devices)
    with obj.reading():
        if failed:
            frame = pd.DataFrame(
                [{"kernel": p.kernel_name, "problem": p.static_key, "bucket": p.bucket,
                  "config": p.config_json, "reason": p.reason, "gpu_name": device.gpu_name,
                  "recorded_at": p.recorded_at.isoformat(timespec="seconds")}
                 for device, p in quarantined_points(db, fingerprint, kernel)])
            what = "no quarantined points"
        else:
            frame, what = winners_frame(db, fingerprint, kernel), "no winners stored"
    if frame.empty:
        click.echo(what + (f" for {kernel}" if kernel else ""))
        return
    click.echo(frame.to_string(index=False))
