"""The compiled-artifact cache as the commands see it: where it is, and the C compiler that
links its files (tune and cache build store artifacts)."""

from __future__ import annotations

from pathlib import Path

import click


def artifacts_dir() -> Path:
    from cutetune.build.artifacts import ARTIFACTS_DIR
    from cutetune.settings import load_settings

    return load_settings().cache_dir / ARTIFACTS_DIR


def require_c_compiler() -> None:
    from cutetune.build.artifacts import NO_COMPILER, c_compiler

    if c_compiler() is None:
        raise click.UsageError(NO_COMPILER)
