"""`cutetune bench`: cutetune beside torch and the peer libraries, timed on this GPU."""

from __future__ import annotations

from collections.abc import Sequence

import click

from cutetune.cli.context import Context
from cutetune.cli.options import (
    CATALOG_HELP,
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
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write every row to this CSV file")
@click.pass_obj
def bench(obj: Context, kernel: str, model: str, dtype: str, tokens: tuple[int, ...],
          out: str | None) -> None:
    """Time cutetune (tuned and default) beside torch and the peer libraries on this GPU."""
    import torch

    from cutetune.cli.files import check_output, open_for_writing
    from cutetune.kernels.registry import get_kernel
    from cutetune.settings import load_settings

    kdef = get_kernel(kernel)
    problems = model_problems(kdef, model, dtype)
    if not torch.cuda.is_available():
        raise click.UsageError("cutetune bench needs a CUDA GPU and none is visible")
    token_buckets(tokens)  # says which bucket's winner serves a count that is not a bucket
    from cutetune.bench import csv_rows, run_bench

    if out:
        check_output(out)
    db = obj.open_db(writable=True)
    handle = open_for_writing(out) if out else None
    click.echo(f"benchmarking {kernel} for {model} ({len(problems)} problems x {len(tokens)} "
               f"token counts); measuring the copy ceiling first ...", err=True)
    result = run_bench(kdef, problems, tokens, db,
                       on_problem=lambda rows: click.echo(bench_table(rows) + "\n"),
                       on_candidate=lambda line: click.echo(line, err=True),
                       cache_dir=load_settings().cache_dir)
    click.echo(f"{result.gpu_name}: copy ceiling {result.copy_gbps:.0f} GB/s; empty kernel "
               f"{result.empty_kernel_us:.2f} us per launch in a CUDA graph; rows stored in "
               f"{obj.shown_url}")
    if handle is not None:
        import csv

        with handle:
            rows = csv_rows(kdef, result)
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        click.echo(f"wrote {out}", err=True)


def bench_table(rows: Sequence) -> str:
    """One problem's bench rows (cutetune.bench.BenchRow) as a table under the problem, with
    ours' speedup over the best peer."""
    from cutetune.bench import speedup_over_best_peer
    from cutetune.cli.table import render_table

    cells = [(r.implementation, "-", "", "", "", r.note) if r.median_us is None else
             (r.implementation, f"{r.median_us:.2f}", f"{r.iqr_us:.2f}", f"{r.gbps:.0f}",
              f"{r.pct_of_copy:.1f}%", r.note) for r in rows]
    lines = [rows[0].problem.describe(),
             render_table(("implementation", "us", "IQR", "GB/s", "% copy", "note"), cells,
                          right={"us", "IQR", "GB/s", "% copy"}, indent="  ")]
    speedup = speedup_over_best_peer(rows)
    if speedup is not None:
        lines.append(f"  cutetune vs best peer: {speedup:.2f}x")
    return "\n".join(lines)
