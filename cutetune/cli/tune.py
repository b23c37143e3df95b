"""`cutetune tune`: tune a kernel, or every kernel a model uses, bucket by bucket on the GPU."""

from __future__ import annotations

import sys

import click

from cutetune.cli.context import Context
from cutetune.cli.options import (
    CATALOG_HELP,
    FiniteFloatRange,
    KernelName,
    dtype_option,
    model_option,
    parse_gpus,
    token_buckets,
    tokens_option,
)
from cutetune.cli.problems import model_problems
from cutetune.tuner.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_TIE_BAND_PERCENT,
    DEFAULT_TRIAL_TIMEOUT_S,
    MAX_TIE_BAND_PERCENT,
)


@click.command(epilog=CATALOG_HELP)
@click.argument("kernel", type=KernelName(), required=False)
@model_option
@dtype_option
@tokens_option
@click.option("--trials", default=DEFAULT_BUDGET, show_default=True,
              type=click.IntRange(min=1), help="trial budget per token bucket")
@click.option("--force", is_flag=True,
              help="re-tune buckets already stored, each from its first trial")
@click.option("--retry-failed", is_flag=True,
              help="try again the points that hung or crashed (see show --failed)")
@click.option("--trial-timeout", default=DEFAULT_TRIAL_TIMEOUT_S, show_default=True,
              type=FiniteFloatRange(min=1), help="seconds a trial may take beyond ten times "
              "its predicted GPU time before its worker is killed")
@click.option("--tie-band", default=DEFAULT_TIE_BAND_PERCENT, show_default=True,
              type=FiniteFloatRange(0, MAX_TIE_BAND_PERCENT), metavar="PERCENT",
              help="finalists re-measured within this many percent of the fastest (or within "
                   "its timing's IQR, where wider) are tied; the default wins a tie, else the "
                   "point the cost model ranks best (then canonical JSON), so that runs name "
                   "the same winner")
@click.option("--seed", default=0, show_default=True)
@click.option("--gpus", default=None, callback=parse_gpus,
              help="GPUs to tune on, one worker each, e.g. 0,1 (all of one model); each takes "
                   "the next bucket left [default: the GPU torch uses]")
@click.pass_obj
def tune(obj: Context, kernel: str | None, model: str, dtype: str, tokens: tuple[int, ...],
         trials: int, force: bool, retry_failed: bool, trial_timeout: float, tie_band: float,
         seed: int, gpus: tuple[int, ...] | None) -> None:
    """Tune KERNEL, or every kernel the model uses, for each token bucket on this GPU (or on
    each of --gpus).

    Trials run in worker processes (compiles in a pool of CPU processes, verification and
    timing in a GPU worker per GPU, a bucket's trials all on one) under a watchdog; every trial
    and each bucket's winner are stored. Stopped at any moment (Ctrl-C, kill), the same command
    continues: stored buckets are skipped, a bucket in progress continues from its stored
    trials."""
    import torch

    from cutetune.cli.artifacts import require_c_compiler
    from cutetune.cli.progress import RunProgress, summary_table, time_split_line
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.settings import load_settings
    from cutetune.tuner.isolated import MixedGpusError, Workers
    from cutetune.tuner.model_run import RunOptions, Unit, tune_model

    kernels = [get_kernel(kernel)] if kernel else [get_kernel(n) for n in kernel_names()]
    units = [Unit(k, problem) for k in kernels
             for problem in model_problems(k, model, dtype, skip_if_absent=kernel is None)]
    if not units:
        raise click.UsageError(f"no kernel of cutetune applies to model {model!r}")
    if not torch.cuda.is_available():
        raise click.UsageError("cutetune tune needs a CUDA GPU and none is visible "
                               "(cutetune plan works without one)")
    visible = torch.cuda.device_count()
    if gpus is not None and max(gpus) >= visible:
        raise click.UsageError(f"--gpus {','.join(map(str, gpus))}: GPU {max(gpus)} is not "
                               f"visible; this machine shows {visible} (0 to {visible - 1})")
    require_c_compiler()
    db = obj.open_db(writable=True)
    buckets = token_buckets(tokens)
    workers = Workers(load_settings().cache_dir, sorted({k.compile_function.__module__
                                                          for k in kernels}),
                      seed=seed, trial_timeout_s=trial_timeout, gpus=gpus)
    click.echo(f"tuning {len(units)} problems of {model} x {len(buckets)} buckets "
               f"({trials} trials each at most); results in {obj.shown_url}", err=True)
    try:
        with RunProgress() as progress:
            summaries = tune_model(units, buckets, db, workers,
                                   RunOptions(trials, seed, force, retry_failed,
                                              tie_band / 100), progress)
    except KeyboardInterrupt:
        click.echo("interrupted: every finished bucket and trial is stored; the same "
                   "command continues", err=True)
        sys.exit(130)
    except MixedGpusError as err:
        raise click.UsageError(f"--gpus: {err}") from None
    click.echo(summary_table(summaries))
    click.echo(time_split_line(workers.split, workers.compile_processes))
