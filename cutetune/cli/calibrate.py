"""`cutetune calibrate`: fit the cost model to each device's stored trials and store it."""

from __future__ import annotations

import click

from cutetune.cli.context import Context


@click.command()
@click.option("--min-trials", default=None, type=click.IntRange(min=8),
              help="verified trials a device needs [default: 40]")
@click.pass_obj
def calibrate(obj: Context, min_trials: int | None) -> None:
    """Fit the cost model's constants (launch, per-wave latency, grid barrier, bandwidth, bytes
    in flight) to each device's verified trials and store them; tuning and warmup on that
    device then rank, prune and pick untuned points with it. Needs no GPU."""
    from cutetune.device.calibration_fit import MIN_TRIALS
    from cutetune.tuner.calibrate import fit_devices, store_calibrations

    # Fitted from the database as it is (a missing one is one line, not created); opened for
    # writing only once there is a model to store.
    found = obj.open_db()
    with obj.reading():
        results = fit_devices(found, min_trials or MIN_TRIALS)
    found.dispose()
    if not results:
        raise click.ClickException(f"{obj.shown_url} holds no device's trials: run cutetune "
                                   "tune first")
    lines = [f"{result.fingerprint.gpu_name} (torch {result.fingerprint.torch}, CuTeDSL "
             f"{result.fingerprint.cutlass_dsl}): "
             + (result.refused if result.model is None else result.model.describe())
             for result in results]
    if all(result.model is None for result in results):  # nothing stored: one line, exit 1
        raise click.ClickException("; ".join(lines))
    db = obj.open_db(writable=True)
    store_calibrations(db, results)
    db.dispose()
    for line in lines:
        click.echo(line)
