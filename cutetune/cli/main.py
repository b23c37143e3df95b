"""The `cutetune` command line: plan, tune, bench, show, export, report."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from cutetune.cli.options import (
    CATALOG_HELP,
    KERNELS_HELP,
    PRESETS_HELP,
    KernelName,
    dtype_option,
    kernel_argument,
    kernel_filter,
    model_option,
    parse_gpus,
    parse_tokens,
    token_buckets,
    tokens_option,
)
from cutetune.settings import load_settings
from cutetune.tuner.defaults import DEFAULT_BUDGET, DEFAULT_TRIAL_TIMEOUT_S, DEFAULT_TUNE_TOKENS
from cutetune.version import __version__

TUNE_TOKENS = ",".join(map(str, DEFAULT_TUNE_TOKENS))

@dataclass(frozen=True)
class Context:
    db_url: str
    # Whether db_url is cutetune's default file rather than a URL given by --db or CUTETUNE_DB.
    db_is_default: bool = False

    @property
    def shown_url(self) -> str:
        """The URL with its password masked."""
        from cutetune.results_db.session import shown_url

        return shown_url(self.db_url)

    def open_db(self, writable: bool = False, missing_ok: bool = False):
        """The results database: read-only (nothing created or changed) unless `writable`,
        which also checks now that it takes writes, before any work whose results could not
        be stored. Read-only, a database that does not exist is one line (reading it as empty
        would hide a mistyped path), or None where `missing_ok`."""
        from sqlalchemy.exc import DatabaseError

        from cutetune.results_db import Database
        from cutetune.results_db.session import MissingDatabaseError

        try:
            db = Database.open(self.db_url, read_only=not writable)
            if writable:
                db.check_writable()
            return db
        except MissingDatabaseError as err:
            if missing_ok:
                return None
            raise click.BadParameter(f"{err} (run cutetune tune first, or give --db)",
                                     param_hint="--db") from None
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--db") from None
        except DatabaseError as err:
            verb = "write to" if writable else "open"
            raise click.BadParameter(f"cannot {verb} the database {self.shown_url}: "
                                     f"{_first_line(err.orig)}", param_hint="--db") from None

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Queries of a command that only reads: a database without cutetune's tables (or an
        older one without the newest) is one line, not a traceback."""
        from sqlalchemy.exc import DatabaseError

        try:
            yield
        except DatabaseError as err:
            raise click.BadParameter(f"cannot read the database {self.shown_url}: "
                                     f"{_first_line(err.orig)}", param_hint="--db") from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _model_problems(kernel, model: str, dtype: str, skip_if_absent: bool = False):
    """The kernel's problems in the model; none, said on stderr, if it does not apply and
    `skip_if_absent`."""
    from cutetune.kernels.registry import NotApplicableError
    from cutetune.spaces.models import UnknownModelError, load_model

    try:
        return kernel.problems_for_model(load_model(model), dtype)
    except UnknownModelError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    except NotApplicableError as err:
        if skip_if_absent:
            click.echo(f"skipping {kernel.name}: {err}", err=True)
            return []
        raise click.UsageError(str(err)) from None
    except ValueError as err:  # a size or dtype outside what the kernel's problem accepts
        raise click.UsageError(f"{kernel.name} cannot serve {model}: {err}") from None


class CutetuneGroup(click.Group):
    """The command group; a problem that no point of its kernel's space can serve (an MLP
    width no vector divides, say) is the user's input, so it ends as one line too."""

    def invoke(self, ctx: click.Context):
        from cutetune.spaces.space import EmptySpaceError

        try:
            return super().invoke(ctx)
        except EmptySpaceError as err:
            raise click.UsageError(str(err)) from None


@click.group(cls=CutetuneGroup, epilog=CATALOG_HELP)
@click.version_option(version=__version__, prog_name="cutetune")
@click.option("--db", "db_url", default=None,
              help="SQLAlchemy URL of the results DB [env CUTETUNE_DB; default: a SQLite file "
                   "in ~/.cache/cutetune]")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """Autotune CuTeDSL inference kernels and serve the winners."""
    # An empty --db is kept, to be refused as one, not read as the default.
    settings = load_settings()
    ctx.obj = Context(settings.db_url, settings.db_is_default) if db_url is None \
        else Context(db_url)


@cli.command(epilog=CATALOG_HELP)
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
    from cutetune.spaces.space import config_to_json
    from cutetune.tuner.plan import make_plan
    from cutetune.tuner.roofline import DEVICE_SPECS, Ceilings

    kdef = get_kernel(kernel)
    spec = DEVICE_SPECS[device_name]
    ceilings = Ceilings.from_datasheet(spec)
    statics = _model_problems(kdef, model, dtype)
    buckets = token_buckets(tokens)
    for static in statics:
        for bucket in buckets:
            problem = static.with_tokens(bucket)
            result = make_plan(kdef, problem, spec, ceilings)
            default = kdef.default_config(problem, spec)
            click.echo(f"{problem.describe()} on {spec.name}")
            click.echo(f"  {result.funnel()}")
            for rank, point in enumerate(result.kept[:top], 1):
                mark = "  (default)" if point.config == default else ""
                click.echo(f"  {rank:>3}. {point.prediction.predicted_us:9.2f} us  "
                           f"{config_to_json(point.config)}{mark}")
            click.echo(f"  default: {config_to_json(default)}")


@cli.command(epilog=CATALOG_HELP)
@click.argument("kernel", type=KernelName(), required=False)
@model_option
@dtype_option
@click.option("--tokens", default=TUNE_TOKENS, callback=parse_tokens,
              help="token counts, each served by its bucket: the power of two at or above it "
                   "[default: every power of two from 1 to 32768]")
@click.option("--trials", default=DEFAULT_BUDGET, show_default=True,
              type=click.IntRange(min=1), help="trial budget per token bucket")
@click.option("--force", is_flag=True,
              help="re-tune buckets already stored, each from its first trial")
@click.option("--retry-failed", is_flag=True,
              help="try again the points that hung or crashed (see show --failed)")
@click.option("--trial-timeout", default=DEFAULT_TRIAL_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=1), help="seconds a trial may take beyond ten times "
              "its predicted GPU time before its worker is killed")
@click.option("--seed", default=0, show_default=True)
@click.option("--gpus", default=None, callback=parse_gpus,
              help="GPUs to tune on, one worker each, e.g. 0,1 (all of one model); each takes "
                   "the next bucket left [default: the GPU torch uses]")
@click.pass_obj
def tune(obj: Context, kernel: str | None, model: str, dtype: str, tokens: tuple[int, ...],
         trials: int, force: bool, retry_failed: bool, trial_timeout: float, seed: int,
         gpus: tuple[int, ...] | None) -> None:
    """Tune KERNEL, or every kernel the model uses, for each token bucket on this GPU (or on
    each of --gpus).

    Trials run in worker processes (compiles in a pool of CPU processes, verification and
    timing in a GPU worker per GPU, a bucket's trials all on one) under a watchdog; every trial
    and each bucket's winner are stored. Stopped at any moment (Ctrl-C, kill), the same command
    continues: stored buckets are skipped, a bucket in progress continues from its stored
    trials."""
    import torch

    from cutetune.cli.progress import RunProgress, summary_table, time_split_line
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.tuner.isolated import MixedGpusError, Workers
    from cutetune.tuner.model_run import RunOptions, Unit, tune_model

    kernels = [get_kernel(kernel)] if kernel else [get_kernel(n) for n in kernel_names()]
    units = [Unit(k, problem) for k in kernels
             for problem in _model_problems(k, model, dtype, skip_if_absent=kernel is None)]
    if not units:
        raise click.UsageError(f"no kernel of cutetune applies to model {model!r}")
    if not torch.cuda.is_available():
        raise click.UsageError("cutetune tune needs a CUDA GPU and none is visible "
                               "(cutetune plan works without one)")
    visible = torch.cuda.device_count()
    if gpus is not None and max(gpus) >= visible:
        raise click.UsageError(f"--gpus {','.join(map(str, gpus))}: GPU {max(gpus)} is not "
                               f"visible; this machine shows {visible} (0 to {visible - 1})")
    _require_c_compiler()
    db = obj.open_db(writable=True)
    buckets = token_buckets(tokens)
    workers = Workers(load_settings().cache_dir, sorted({k.compile_function.__module__
                                                          for k in kernels}),
                      seed=seed, trial_timeout_s=trial_timeout, gpus=gpus)
    progress = RunProgress()
    click.echo(f"tuning {len(units)} problems of {model} x {len(buckets)} buckets "
               f"({trials} trials each at most); results in {obj.shown_url}", err=True)
    try:
        summaries = tune_model(units, buckets, db, workers,
                               RunOptions(trials, seed, force, retry_failed), progress)
    except KeyboardInterrupt:
        click.echo("\ninterrupted: every finished bucket and trial is stored; the same "
                   "command continues", err=True)
        sys.exit(130)
    except MixedGpusError as err:
        raise click.UsageError(f"--gpus: {err}") from None
    click.echo(summary_table(summaries))
    click.echo(time_split_line(workers.split, workers.compile_processes))


@cli.command(epilog=CATALOG_HELP)
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

    kdef = get_kernel(kernel)
    problems = _model_problems(kdef, model, dtype)
    if not torch.cuda.is_available():
        raise click.UsageError("cutetune bench needs a CUDA GPU and none is visible")
    token_buckets(tokens)  # says which bucket's winner serves a count that is not a bucket
    from cutetune.bench import csv_rows, format_rows, run_bench

    if out:
        _check_output(out)
    db = obj.open_db(writable=True)
    handle = _open_for_writing(out) if out else None
    click.echo(f"benchmarking {kernel} for {model} ({len(problems)} problems x {len(tokens)} "
               f"token counts); measuring the copy ceiling first ...", err=True)
    result = run_bench(kdef, problems, tokens, db,
                       on_problem=lambda rows: click.echo(format_rows(rows) + "\n"),
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


def _check_output(path: str) -> None:
    """Check that an output file can be written, before the long work, so a bad path fails at
    once; it is created only once there is something to write, so a command that fails on the
    way leaves no empty file behind."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        why = "it is a directory"
    elif not folder.is_dir():
        why = f"no such directory {folder}"
    elif not os.access(folder, os.W_OK | os.X_OK) or (target.exists()
                                                      and not os.access(target, os.W_OK)):
        why = "permission denied"
    else:
        return
    raise click.BadParameter(f"cannot write {path}: {why}", param_hint="--out")


def _open_for_writing(path: str):
    """Create an output file (its path checked first by _check_output)."""
    try:
        return open(path, "w", newline="")
    except OSError as err:
        raise click.BadParameter(f"cannot write {path}: {err.strerror}",
                                 param_hint="--out") from None


@cli.command(epilog=KERNELS_HELP)
@kernel_filter
@click.option("--all-devices", is_flag=True, help="winners of every device, not only this GPU")
@click.option("--failed", is_flag=True,
              help="the quarantined points (they hung or crashed a worker) and why, instead")
@click.pass_obj
def show(obj: Context, kernel: str | None, all_devices: bool, failed: bool) -> None:
    """Print the stored winners (or the quarantined points) as a table."""
    import pandas as pd

    from cutetune.results_db import quarantined_points, winners_frame

    db, fingerprint = obj.open_db(), _fingerprint_or_none(all_devices)
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


@cli.command(epilog=CATALOG_HELP)
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), required=True)
@kernel_filter
@click.option("--model", "-m", default=None,
              help="only the problems this model uses (preset name or HF config.json path)")
@dtype_option
@click.option("--all-devices", is_flag=True, help="winners of every device, not only this GPU")
@click.option("--current", is_flag=True,
              help="only winners measured with the installed kernels' code (their source hash)")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="file to write (default: standard output)")
@click.pass_obj
def export(obj: Context, fmt: str, kernel: str | None, model: str | None, dtype: str,
           all_devices: bool, current: bool, out: str | None) -> None:
    """Export the stored winners as JSON or CSV."""
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.results_db import export_winners

    names = [kernel] if kernel else kernel_names()
    problems = None if model is None else {
        (name, problem.static_key()) for name in names
        for problem in _model_problems(get_kernel(name), model, dtype, skip_if_absent=True)}
    source_hashes = {name: get_kernel(name).source_hash() for name in names} if current else None
    db = obj.open_db()
    with obj.reading():
        text = export_winners(db, fmt, _fingerprint_or_none(all_devices), kernel, problems,
                              source_hashes)
    if out is None:
        click.echo(text, nl=False)
    else:
        with _open_for_writing(out) as handle:
            handle.write(text)
        click.echo(f"wrote {out}", err=True)


@cli.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default=None,
              help="the file's format [default: from its suffix]")
@click.option("--skip-invalid", is_flag=True,
              help="store the valid rows of a file that has invalid ones (each refused row is "
                   "still named) [default: a file with any invalid row stores nothing]")
@click.pass_obj
def import_(obj: Context, path: str, fmt: str | None, skip_invalid: bool) -> None:
    """Store the winners of a `cutetune export` file (served only on the GPU each was
    measured on), each row checked as a freshly tuned winner is; all or nothing unless
    --skip-invalid."""
    from cutetune.results_db import check_import, store_import
    from cutetune.tuner.roofline import device_spec_for

    fmt = fmt or {".json": "json", ".csv": "csv"}.get(Path(path).suffix.lower())
    if fmt is None:
        raise click.BadParameter("cannot tell the format from the suffix: use --format",
                                 param_hint="PATH")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise click.BadParameter(f"cannot read {path}: {why}", param_hint="PATH") from None
    # Everything is checked before the database is opened, so a refused file creates nothing.
    try:
        checked = check_import(text, fmt, device_spec_for)
    except ValueError as err:
        raise click.UsageError(f"{path}: {err}") from None
    for refusal in checked.refused:
        click.echo(f"{path}: {refusal}", err=True)
    refused = len(checked.refused)
    if refused and not skip_invalid:
        raise click.UsageError(f"{path}: {refused} of {checked.rows} rows refused (above); "
                               "nothing imported (--skip-invalid stores the valid ones)")
    if refused and not checked.runs:
        raise click.UsageError(f"{path}: all {checked.rows} rows refused (above); nothing "
                               "imported")
    db = obj.open_db(writable=True)
    stored = store_import(db, checked)
    click.echo(f"imported {stored} winners from {path}; {checked.duplicates} duplicate rows "
               f"(stored once); {refused} rows refused", err=True)


# The packages of the `report` extra, which the HTML report needs (the Markdown one does not).
REPORT_PACKAGES = ("matplotlib", "nbformat", "nbclient", "ipykernel", "nbconvert")


@cli.command(epilog=PRESETS_HELP)
@model_option
@dtype_option
@click.option("--db", "db_url", default=None,
              help="SQLAlchemy URL of the results DB [default: cutetune's --db]")
@click.option("--device", default=None,
              help="the device to report on, by (part of) its GPU name [default: the one "
                   "with the most winners for the model]")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default="html",
              show_default=True,
              help="html: the report notebook run headless, figures embedded; md: its tables")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="file to write [default: report.html; the Markdown on standard output]")
@click.pass_obj
def report(obj: Context, model: str, dtype: str, db_url: str | None, device: str | None,
           fmt: str, out: str | None) -> None:
    """Report one model's tuning results from the database: the devices and their ceilings,
    which buckets are tuned, the bench rows against the peers, the winners' configurations,
    the searches, the roofline's predictions and the failures."""
    from cutetune.report.data import devices_named, load_report_data, model_problems
    from cutetune.results_db import devices_frame
    from cutetune.spaces.models import UnknownModelError

    obj = Context(db_url) if db_url is not None else obj
    try:
        model_problems(model, dtype)
    except UnknownModelError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    # A bad URL, an unreadable file or an unknown device is one line, before any work.
    db = obj.open_db()
    try:
        with obj.reading():
            devices_named(devices_frame(db), device)
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
        _check_output(out)
    if fmt == "md":
        from cutetune.report.markdown import render_markdown

        with obj.reading():
            data = load_report_data(obj.db_url, model, device, dtype)
        text = render_markdown(data, on_section=lambda s: click.echo(f"report: {s.title}",
                                                                      err=True))
    else:
        text = _report_html(obj.db_url, model, device, dtype)
    if out is None:
        click.echo(text, nl=False)
        return
    with _open_for_writing(out) as handle:
        handle.write(text)
    click.echo(f"wrote {out}", err=True)


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


@cli.group()
def cache() -> None:
    """The compiled-artifact cache: list it, clear it, or fill it ahead of time."""


def _artifacts_dir():
    from cutetune.tuner.artifacts import ARTIFACTS_DIR

    return load_settings().cache_dir / ARTIFACTS_DIR


@cache.command("ls")
def cache_ls() -> None:
    """List the stored artifacts: kernel, arch, problem, config, size."""
    from cutetune.tuner.artifacts import ArtifactStore

    directory = _artifacts_dir()
    entries = ArtifactStore(directory, "any").entries() if directory.is_dir() else []
    for entry in entries:
        click.echo(f"{entry.get('kernel', '?'):<14} {entry.get('arch', '?'):<8} "
                   f"{entry['bytes'] / 1024:8.1f} KiB  {entry.get('problem', entry['file'])}  "
                   f"{entry.get('config', '')}")
    click.echo(f"{len(entries)} artifacts in {directory}", err=True)


@cache.command("clear")
def cache_clear() -> None:
    """Delete every stored artifact."""
    from cutetune.tuner.artifacts import clear_artifacts

    directory = _artifacts_dir()
    removed = clear_artifacts(directory) if directory.is_dir() else 0
    click.echo(f"removed {removed} files from {directory}", err=True)


@cache.command("build", epilog=PRESETS_HELP)
@model_option
@dtype_option
@click.option("--device", "device_name", type=click.Choice(["H100 SXM", "H200", "B200"]),
              default="H200", show_default=True,
              help="the GPU the artifacts are for (its arch, and its winners in the DB)")
@click.option("--jobs", default=os.cpu_count() or 1, show_default=True,
              type=click.IntRange(min=1), help="compile processes")
@click.pass_obj
def cache_build(obj: Context, model: str, dtype: str, device_name: str, jobs: int) -> None:
    """Compile every point a warmup of the model would serve on DEVICE (its winners stored in
    the DB, then those shipped with cutetune, the defaults elsewhere) into the cache; runs on
    a machine without a GPU, for shipping the cache to GPU hosts."""
    from cutetune.dispatch import Dispatcher
    from cutetune.kernels.code_hash import CODE_HASHES, remember_in
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.results_db import shipped_with_devices, winners_with_devices
    from cutetune.tuner.artifacts import ArtifactStore, arch_for
    from cutetune.tuner.roofline import DEVICE_SPECS

    spec = DEVICE_SPECS[device_name]
    # The model, the database and the compiler are checked before the cache directory is
    # touched (created, or its code-hash memo written), so a mistaken command leaves nothing.
    work = [(kernel, problems) for kernel in map(get_kernel, kernel_names())
            if (problems := _model_problems(kernel, model, dtype, skip_if_absent=True))]
    # A build host that never tuned has no database at the default path: it builds the
    # shipped winners and the defaults. A database someone named must exist.
    db = obj.open_db(missing_ok=obj.db_is_default)
    if db is None:
        click.echo(f"no results database at {obj.shown_url}: building the shipped winners "
                   "and the defaults", err=True)
        stored = []
    else:
        with obj.reading():
            stored = winners_with_devices(db)
        db.dispose()
    _require_c_compiler()

    def for_the_device(pairs):
        return [winner for device, winner in pairs if _names_device(device.gpu_name, spec)
                and device.compute_capability == spec.compute_capability]

    store = ArtifactStore(_artifacts_dir(), arch_for(spec.compute_capability))
    if not store.writable():
        raise click.UsageError(f"the artifact cache {store.directory} cannot be written")
    remember_in(store.directory / CODE_HASHES)
    dispatcher = Dispatcher(spec, for_the_device(stored), store, compile_processes=jobs,
                            shipped=for_the_device(shipped_with_devices()))
    start = time.perf_counter()
    points, compiled = dispatcher.precompile(work)
    click.echo(f"{points} points for {store.arch}: {compiled} compiled ({jobs} processes), "
               f"{points - compiled} already stored, in {time.perf_counter() - start:.1f} s; "
               f"cache {store.directory}", err=True)


def _require_c_compiler() -> None:
    """Tuning and cache build store artifacts, which a C compiler links."""
    from cutetune.tuner.artifacts import NO_COMPILER, c_compiler

    if c_compiler() is None:
        raise click.UsageError(NO_COMPILER)


def _names_device(gpu_name: str, spec) -> bool:
    from cutetune.tuner.roofline import device_spec_for

    try:
        return device_spec_for(gpu_name) == spec
    except ValueError:
        return False


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
