"""`cutetune plan`: the funnel and the roofline ranking of a kernel's points, without a GPU."""

from __future__ import annotations

import click

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
@device_option("device whose roofline to use")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1),
              help="ranked points shown per bucket")
def plan(kernel: str, model: str, dtype: str, tokens: tuple[int, ...], device, top: int) -> None:
    """Show the funnel and the roofline ranking; needs no GPU."""
    from cutetune.cli.table import render_table
    from cutetune.device.funnel import make_plan
    from cutetune.device.specs import Ceilings
    from cutetune.kernels.registry import get_kernel
    from cutetune.spaces.space import config_to_json

    kdef = get_kernel(kernel)
    ceilings = Ceilings.from_datasheet(device)
    statics = model_problems(kdef, model, dtype)
    buckets = token_buckets(tokens)
    for static in statics:
        for bucket in buckets:
            problem = static.with_tokens(bucket)
            result = make_plan(kdef, problem, device, ceilings)
            default = kdef.default_config(problem, device)
            click.echo(f"{problem.describe()} on {device.name}")
            click.echo(f"  {result.funnel()}")
            ranked = [(f"{rank}.", f"{point.prediction.predicted_us:.2f}",
                       config_to_json(point.config)
                       + ("  (default)" if point.config == default else ""))
                      for rank, point in enumerate(result.kept[:top], 1)]
            click.echo(render_table(("rank", "predicted us", "config"), ranked,
                                    right={"rank", "predicted us"}, indent="  "))
            click.echo(f"  default: {config_to_json(default)}")
