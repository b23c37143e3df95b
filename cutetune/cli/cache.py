"""`cutetune cache`: list, clear or fill ahead of time the compiled-artifact cache."""

from __future__ import annotations

import os

import click

from cutetune.cli.artifacts import artifacts_dir
from cutetune.cli.context import Context
from cutetune.cli.options import PRESETS_HELP, device_option, dtype_option, model_option


@click.group()
def cache() -> None:
    """The compiled-artifact cache: list it, clear it, or fill it ahead of time."""


@cache.command("ls")
def cache_ls() -> None:
    """List the stored artifacts: kernel, arch, problem, config, size."""
    from cutetune.build.artifacts import ArtifactStore
    from cutetune.cli.table import render_table

    directory = artifacts_dir()
    entries = ArtifactStore(directory, "any").entries() if directory.is_dir() else []
    if entries:
        click.echo(render_table(
            ("kernel", "arch", "KiB", "problem", "config"),
            ((entry.get("kernel", "?"), entry.get("arch", "?"), f"{entry['bytes'] / 1024:.1f}",
              entry.get("problem", entry["file"]), entry.get("config", ""))
             for entry in entries), right={"KiB"}))
    click.echo(f"{len(entries)} artifacts in {directory}", err=True)


@cache.command("clear")
def cache_clear() -> None:
    """Delete every stored artifact."""
    from cutetune.build.artifacts import clear_artifacts

    directory = artifacts_dir()
    removed = clear_artifacts(directory) if directory.is_dir() else 0
    click.echo(f"removed {removed} files from {directory}", err=True)


@cache.command("build", epilog=PRESETS_HELP)
@model_option
@dtype_option
@device_option("the GPU the artifacts are for (its arch, and its winners in the DB)")
@click.option("--jobs", default=os.cpu_count() or 1, show_default=True,
              type=click.IntRange(min=1), help="compile processes")
@click.pass_obj
def cache_build(obj: Context, model: str, dtype: str, device, jobs: int) -> None:
    """Compile every point a warmup of the model would serve on DEVICE (its winners stored in
    the DB, then those shipped with cutetune, the calibrated model's picks where the DB holds a
    calibration for DEVICE, the defaults elsewhere) into the cache; runs on a machine without
    a GPU, for shipping the cache to GPU hosts."""
    import time

    from cutetune.build.artifacts import ArtifactStore, arch_for
    from cutetune.cli.artifacts import require_c_compiler
    from cutetune.cli.problems import checked_model, model_problems
    from cutetune.device.calibrated import read_stored
    from cutetune.kernels.code_hash import CODE_HASHES, remember_in
    from cutetune.kernels.registry import get_kernel, kernel_names
    from cutetune.results_db import (
        calibrations_with_devices,
        shipped_with_devices,
        winners_with_devices,
    )
    from cutetune.serving.plan import ServingPlan, say_skipped
    from cutetune.serving.precompile import precompile
    from cutetune.serving.predicted import PICKS_FILE

    # The model, the database and the compiler are checked before the cache directory is
    # touched (created, or its code-hash memo written), so a mistaken command leaves nothing,
    # and before the kernels the model skips are told, so that an error is the only line.
    checked_model(model)
    # A build host that never tuned has no database at the default path: it builds the
    # shipped winners and the defaults. A database someone named must exist.
    db = obj.open_db(missing_ok=obj.db_is_default)
    if db is None:
        click.echo(f"no results database at {obj.shown_url}: building the shipped winners "
                   "and the defaults", err=True)
        stored, calibrations = [], []
    else:
        with obj.reading():
            stored = winners_with_devices(db)
            calibrations = calibrations_with_devices(db)
        db.dispose()
    require_c_compiler()
    work = [(kernel, problems) for kernel in map(get_kernel, kernel_names())
            if (problems := model_problems(kernel, model, dtype, skip_if_absent=True))]

    def for_the_device(pairs):
        return [winner for stored_on, winner in pairs if _names_device(stored_on.gpu_name, device)
                and stored_on.compute_capability == device.compute_capability]

    store = ArtifactStore(artifacts_dir(), arch_for(device.compute_capability))
    if not store.writable():
        raise click.UsageError(f"the artifact cache {store.directory} cannot be written")
    remember_in(store.directory / CODE_HASHES)
    fitted = [(when, params) for stored_on, when, params in calibrations
              if _names_device(stored_on.gpu_name, device)
              and stored_on.compute_capability == device.compute_capability]
    # The picks go where the GPU host's warmup reads them: beside the artifacts.
    plan = ServingPlan(device, for_the_device(stored), for_the_device(shipped_with_devices()),
                       on_rejected=say_skipped,
                       calibrated=read_stored(max(fitted)[1]) if fitted else None,
                       picks_file=store.directory / PICKS_FILE)
    start = time.perf_counter()
    points, compiled = precompile(plan, store, work, jobs)
    plan.save_picks()
    click.echo(f"{points} points for {store.arch}: {compiled} compiled ({jobs} processes), "
               f"{points - compiled} already stored, in {time.perf_counter() - start:.1f} s; "
               f"cache {store.directory}", err=True)


def _names_device(gpu_name: str, spec) -> bool:
    from cutetune.device.specs import device_spec_for

    try:
        return device_spec_for(gpu_name) == spec
    except ValueError:
        return False
