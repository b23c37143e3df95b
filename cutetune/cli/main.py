"""The `cutetune` command line: plan, tune, bench, show, export."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from cutetune.settings import load_settings

DEFAULT_TOKENS = "1,8,64,512,4096,32768"
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Context:
    db_url: str

    def open_db(self):
        from sqlalchemy.exc import OperationalError

        from cutetune.results_db import Database

        try:
            return Database.open(self.db_url)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--db") from None
        except OperationalError as err:
            raise click.BadParameter(f"cannot reach the database {self.db_url!r}: "
                                     f"{str(err.orig).strip().splitlines()[0]}",
                                     param_hint="--db") from None


def _kernel_choice() -> click.Choice:
    from cutetune.kernels.registry import kernel_names

    return click.Choice(kernel_names())


def parse_tokens(ctx, param, value: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token counts, "
                                 "e.g. 1,8,64") from None
    if not tokens or min(tokens) < 1:
        raise click.BadParameter(f"token counts must be positive integers, got {value!r}")
    return tokens


def _model_problems(kernel, model: str, dtype: str):
    from cutetune.kernels.registry import NotApplicableError
    from cutetune.spaces.models import UnknownModelError, load_model

    try:
        return kernel.problems_for_model(load_model(model), dtype)
    except UnknownModelError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    except NotApplicableError as err:
        raise click.UsageError(str(err)) from None


kernel_argument = click.argument("kernel", type=_kernel_choice())
model_option = click.option("--model", "-m", required=True,
                            help="preset name (e.g. qwen3-8b) or path of a HF config.json")
dtype_option = click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16",
                            show_default=True, help="activation dtype")
tokens_option = click.option("--tokens", default=DEFAULT_TOKENS, show_default=True,
                             callback=parse_tokens, help="token counts (one bucket each)")


@click.group()
@click.option("--db", "db_url", default=None,
              help="SQLAlchemy URL of the results DB [env CUTETUNE_DB; default: a SQLite file "
                   "in ~/.cache/cutetune]")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """Autotune CuTeDSL inference kernels and serve the winners."""
    ctx.obj = Context(db_url or load_settings().db_url)


@cli.command()
@kernel_argument
@model_option
@dtype_option
@tokens_option
@click.option("--device", "device_name", type=click.Choice(["H100 SXM", "H200", "B200"]),
              default="H200", show_default=True, help="device whose roofline to use")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1),
              help="ranked points shown per bucket")
def plan(kernel: str, model: str, dtype: str, tokens: tuple[int, ...], device_name: str,
         top: int) -> None:
    """Show the funnel and the roofline ranking; needs no GPU."""
    from cutetune.kernels.registry import get_kernel
    from cutetune.spaces.buckets import bucket_of
    from cutetune.spaces.space import config_to_json
    from cutetune.tuner.plan import make_plan
    from cutetune.tuner.roofline import DEVICE_SPECS, Ceilings

    kdef = get_kernel(kernel)
    spec = DEVICE_SPECS[device_name]
    ceilings = Ceilings.from_datasheet(spec)
    for static in _model_problems(kdef, model, dtype):
        for n in tokens:
            problem = static.with_tokens(bucket_of(n))
            result = make_plan(kdef, problem, spec, ceilings)
            default = kdef.default_config(problem, spec)
            click.echo(f"{problem.describe()} on {spec.name}")
            click.echo(f"  {result.funnel()}")
            for rank, point in enumerate(result.kept[:top], 1):
                mark = "  (default)" if point.config == default else ""
                click.echo(f"  {rank:>3}. {point.prediction.predicted_us:9.2f} us  "
                           f"{config_to_json(point.config)}{mark}")
            click.echo(f"  default: {config_to_json(default)}")


@cli.command()
@kernel_argument
@model_option
@dtype_option
@tokens_option
@click.option("--trials", default=48, show_default=True, type=click.IntRange(min=1),
              help="trial budget per token bucket")
@click.option("--seed", default=0, show_default=True)
@click.pass_obj
def tune(obj: Context, kernel: str, model: str, dtype: str, tokens: tuple[int, ...],
         trials: int, seed: int) -> None:
    """Search each token bucket on this GPU and store every trial and the winners."""
    import torch

    from cutetune.kernels.registry import get_kernel

    if not torch.cuda.is_available():
        raise click.UsageError("cutetune tune needs a CUDA GPU and none is visible "
                               "(cutetune plan works without one)")
    from cutetune.results_db import DeviceFingerprint, latest_ceilings, record_ceilings
    from cutetune.spaces.buckets import bucket_of
    from cutetune.spaces.space import config_to_json
    from cutetune.tuner.ceilings import measure_ceilings
    from cutetune.tuner.roofline import Ceilings, device_spec_for
    from cutetune.tuner.trials import GpuTrialRunner
    from cutetune.tuner.tune import tune_bucket

    kdef = get_kernel(kernel)
    problems = _model_problems(kdef, model, dtype)
    db = obj.open_db()
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    click.echo(f"{fingerprint.gpu_name} ({fingerprint.sm_count} SMs), results in {db.url}")
    measured = latest_ceilings(db, fingerprint)
    if not measured:
        click.echo("measuring the copy ceiling and the launch floor ...")
        measured = measure_ceilings()
        record_ceilings(db, fingerprint, measured)
    ceilings = Ceilings.from_measured(spec, measured)
    click.echo(f"ceilings: copy {ceilings.copy_gbps:.0f} GB/s, launch floor "
               f"{ceilings.launch_floor_us:.2f} us")
    buckets = sorted({bucket_of(n) for n in tokens})
    for static in problems:
        for bucket in buckets:
            label = f"{kernel} tokens={bucket}"
            with click.progressbar(length=trials, label=label, file=sys.stderr) as bar:
                result = tune_bucket(
                    kdef, static, bucket, spec, ceilings,
                    lambda p: GpuTrialRunner(kdef, p, spec, seed), db, fingerprint, trials,
                    seed, on_trial=lambda outcome: bar.update(1))
            failed = sum(1 for t in result.trials if not t.ok)
            if result.winner is None:
                click.echo(f"  {label}: every point failed ({failed}); first reason: "
                           f"{result.trials[0].failure_reason}")
                continue
            m = result.winner.measurement
            click.echo(f"  {label}: winner {config_to_json(result.winner.config)} "
                       f"{m.median_us:.2f} us (IQR {m.iqr_us:.2f}); {len(result.trials)} "
                       f"trials, {failed} failed{', exhaustive' if result.exhaustive else ''}")


@cli.command()
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

    from cutetune.kernels.registry import get_kernel

    if not torch.cuda.is_available():
        raise click.UsageError("cutetune bench needs a CUDA GPU and none is visible")
    from cutetune.bench import csv_rows, format_rows, run_bench

    kdef = get_kernel(kernel)
    problems = _model_problems(kdef, model, dtype)
    handle = _open_for_writing(out) if out else None
    db = obj.open_db()
    click.echo(f"benchmarking {kernel} for {model} ({len(problems)} problems x {len(tokens)} "
               f"token counts); measuring the copy ceiling first ...", err=True)
    result = run_bench(kdef, problems, tokens, db,
                       on_problem=lambda rows: click.echo(format_rows(rows) + "\n"),
                       on_candidate=lambda line: click.echo(line, err=True))
    click.echo(f"{result.gpu_name}: copy ceiling {result.copy_gbps:.0f} GB/s; empty kernel "
               f"{result.empty_kernel_us:.2f} us per launch in a CUDA graph; rows stored in "
               f"{db.url}")
    if handle is not None:
        import csv

        with handle:
            rows = csv_rows(kdef, result)
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        click.echo(f"wrote {out}", err=True)


def _open_for_writing(path: str):
    """Open an output file before the long work, so a bad path fails at once."""
    try:
        return open(path, "w", newline="")
    except OSError as err:
        raise click.BadParameter(f"cannot write {path}: {err.strerror}",
                                 param_hint="--out") from None


@cli.command()
@click.option("--kernel", default=None, help="only this kernel")
@click.option("--all-devices", is_flag=True, help="winners of every device, not only this GPU")
@click.pass_obj
def show(obj: Context, kernel: str | None, all_devices: bool) -> None:
    """Print the stored winners as a table."""
    from cutetune.results_db import winners_frame

    frame = winners_frame(obj.open_db(), _fingerprint_or_none(all_devices), kernel)
    if frame.empty:
        click.echo("no winners stored" + (f" for {kernel}" if kernel else ""))
        return
    click.echo(frame.to_string(index=False))


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), required=True)
@click.option("--kernel", default=None, help="only this kernel")
@click.option("--all-devices", is_flag=True, help="winners of every device, not only this GPU")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="file to write (default: standard output)")
@click.pass_obj
def export(obj: Context, fmt: str, kernel: str | None, all_devices: bool,
           out: str | None) -> None:
    """Export the stored winners as JSON or CSV."""
    from cutetune.results_db import export_winners

    text = export_winners(obj.open_db(), fmt, _fingerprint_or_none(all_devices), kernel)
    if out is None:
        click.echo(text, nl=False)
    else:
        with _open_for_writing(out) as handle:
            handle.write(text)
        click.echo(f"wrote {out}", err=True)


def _fingerprint_or_none(all_devices: bool):
    """This GPU's fingerprint; every device's winners where asked or where there is no GPU."""
    import torch

    if all_devices or not torch.cuda.is_available():
        return None
    from cutetune.results_db import DeviceFingerprint

    return DeviceFingerprint.current()


def main() -> None:
    cli(prog_name="cutetune")


if __name__ == "__main__":
    main()
