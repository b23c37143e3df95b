"""The files a command writes (--out): checked before the work, created once there is
something to write, so a command that fails on the way leaves no empty file behind."""

from __future__ import annotations

import os
from pathlib import Path

import click


def check_output(path: str) -> None:
    """Check that an output file can be written, before the long work, so a bad path fails at
    once."""
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


def open_for_writing(path: str):
    """Create an output file (its path checked first by check_output)."""
    try:
        return open(path, "w", newline="")
    except OSError as err:
        raise click.BadParameter(f"cannot write {path}: {err.strerror}",
                                 param_hint="--out") from None


def write_output(path: str, text: str) -> None:
    with open_for_writing(path) as handle:
        handle.write(text)
    click.echo(f"wrote {path}", err=True)
