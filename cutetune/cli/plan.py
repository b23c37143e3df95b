"""`cutetune plan`: the funnel and the cost model's ranking of a kernel's points, each point's
predicted time as its terms, without a GPU. The cost model is the device's calibrated one
where `cutetune calibrate` stored one in the database, the datasheet roofline otherwise."""

from __future__ import annotations

import click

from cutetune.cli.context import Context
from cutetune.cli.options import (
    CATALOG_HELP,
    device_option,
    dtype_option,
    kernel_argument,
    model_option,
    token_buckets,
    tokens_option,
)
from cutetune.cli.problems import model_problems


@click.command(epilog=CATALOG_HELP)
@kernel_argument
@model_option
@dtype_option
@tokens_option
@device_option("device whose cost model to use")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1),
              help="ranked points shown per bucket")
@click.option("--datasheet", is_flag=True,
              help="rank by the datasheet roofline even where a calibration is stored")
@click.pass_obj
def plan(obj: Context, kernel: str, model: str, dtype: str, tokens: tuple[int, ...], device,
         top: int, datasheet: bool) -> None:
    """Show the funnel and the cost model's ranking, each point's predicted time as its
    terms, keeping what the tuner keeps (the winners the kernel's other problems lend, stored
    or shipped for a GPU of this model, and the problem's own shipped winner, the incumbent);
    needs no GPU."""
    from cutetune.cli.table import render_table
    from cutetune.device.funnel import Lender, lent_points, make_plan
    from cutetune.device.specs import Ceilings
    from cutetune.kernels.registry import get_kernel
    from cutetune.spaces.space import config_to_json

    kdef = get_kernel(kernel)
    statics = model_problems(kdef, model, dtype)  # a model it refuses is the only output
    buckets = token_buckets(tokens)
    ceilings = Ceilings.from_datasheet(device)
    calibrated, lenders, incumbents = _stored(obj, kdef, device, datasheet)
    click.echo("cost model: " + ("datasheet roofline" if calibrated is None else
                                 f"calibrated for {calibrated.gpu_name}: "
                                 f"{calibrated.describe()}"))
    for static in statics:
        for bucket in buckets:
            problem = static.with_tokens(bucket)
            # The points kept whatever their prediction, each with why.
            always_kept = {config: f"lent by {lender.describe()}" for lender, config in
                           lent_points(kdef, problem, device, lenders.get(bucket, {}))}
            incumbent = incumbents.get(bucket, {}).get(Lender(kdef.name, static.static_key()))
            if incumbent is not None:
                always_kept[incumbent] = "the incumbent: its winner shipped for this GPU"
            result = make_plan(kdef, problem, device, ceilings, calibrated, always_kept)
            default = kdef.default_config(problem, device)
            click.echo(f"{problem.describe()} on {device.name}")
            click.echo(f"  {result.funnel()}")
            if calibrated is not None:
                alone = make_plan(kdef, problem, device, ceilings, lent=always_kept)
                click.echo(f"  the datasheet roofline alone would keep {len(alone.kept)} "
                           f"(prune {len(alone.pruned)})")
            ranked = [(f"{rank}.", f"{point.prediction.predicted_us:.2f}",
                       f"{point.terms.launch_us:.2f}",
                       f"{point.terms.waves_us:.2f} ({point.terms.waves})",
                       f"{point.terms.barrier_us:.2f}",
                       f"{point.terms.memory_us:.2f} ({point.terms.bytes_moved / 1e6:.3g} MB, "
                       f"{100 * point.terms.efficiency:.0f}%)",
                       f"x{point.terms.knob_factor:.2f}",
                       config_to_json(point.config)
                       + ("  (default)" if point.config == default else "")
                       + (f"  ({always_kept[point.config]})"
                          if point.config in always_kept else ""))
                      for rank, point in enumerate(result.kept[:top], 1)]
            click.echo(render_table(
                ("rank", "predicted us", "launch", "waves (n)", "barrier",
                 "memory (bytes, efficiency)", "knobs", "config"), ranked,
                right={"rank", "predicted us", "launch", "waves (n)", "barrier", "knobs"},
                indent="  "))
            click.echo(f"  default: {config_to_json(default)}")


def _stored(obj: Context, kernel, device, datasheet: bool):
    """From one read of the database: the latest calibration stored for a GPU of `device`'s
    model (None with `datasheet`, or where it holds none), the winners lent to `kernel`'s
    problems by bucket and lender (funnel.lenders_by_bucket), shipped or stored for such a
    GPU, and the shipped ones alone, the incumbents. A database that does not exist holds
    neither calibration nor stored winner."""
    from cutetune.device.calibrated import read_stored
    from cutetune.device.funnel import lenders_by_bucket
    from cutetune.results_db.shipped import shipped_with_devices

    calibrations, shipped = [], shipped_with_devices()
    measured = list(shipped)
    db = obj.open_db(missing_ok=True)
    if db is not None:
        from cutetune.results_db import calibrations_with_devices, winners_with_devices

        with obj.reading():
            calibrations = [] if datasheet else calibrations_with_devices(db)
            measured += winners_with_devices(db)
        db.dispose()
    fitted = [(when, params) for fingerprint, when, params in calibrations
              if _of_device(fingerprint.gpu_name, device)]

    def of_device(pairs):
        return [w for fingerprint, w in pairs if _of_device(fingerprint.gpu_name, device)]

    return (read_stored(max(fitted)[1]) if fitted else None,
            lenders_by_bucket(kernel, of_device(measured), device),
            lenders_by_bucket(kernel, of_device(shipped), device))


def _of_device(gpu_name: str, device) -> bool:
    """Whether a GPU of that name is of `device`'s model (a name no spec knows is not)."""
    from cutetune.device.specs import device_spec_for

    try:
        return device_spec_for(gpu_name) == device
    except ValueError:
        return False
