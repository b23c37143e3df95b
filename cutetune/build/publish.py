"""Built files named by their content: `{stem}-{digest of the content}{suffix}`.

A file is built under a temporary name beside its final place and renamed, so a reader never
sees half a file and processes building the same file at once each rename a whole one; a reader
trusts only a file whose content matches the digest in its name (a truncated file can crash the
dynamic loader), and removes the others.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def content_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def publish(stem: Path, build: Callable[[Path], None], suffix: str = ".so") -> Path:
    """Build a file with `build(path)` (it may write scratch files beside `path`), then rename
    it to `{stem}-{content digest}{suffix}` in stem's folder; the published path."""
    with tempfile.TemporaryDirectory(dir=stem.parent) as scratch:
        built = Path(scratch) / f"built{suffix}"
        build(built)
        published = stem.with_name(f"{stem.name}-{content_digest(built)}{suffix}")
        os.replace(built, published)
    return published


def find_published(stem: Path, suffix: str = ".so", listed: Iterable[Path] = ()
                   ) -> tuple[Path | None, list[Path]]:
    """The published file of `stem` whose content matches its name, and the unsound ones
    found (and removed) on the way. `listed`: the files of `stem` an earlier listing of its
    folder found, checked first; where none of them is sound, the folder is searched (a
    glob reads every name in it, which in a folder of thousands of files costs milliseconds
    per search)."""
    unsound: list[Path] = []
    for path in _listed_then_searched(stem, suffix, listed):
        try:
            sound = path.name == f"{stem.name}-{content_digest(path)}{suffix}"
        except FileNotFoundError:  # removed since it was listed
            continue
        if sound:
            return path, unsound
        path.unlink(missing_ok=True)
        unsound.append(path)
    return None, unsound


def _listed_then_searched(stem: Path, suffix: str, listed: Iterable[Path]) -> Iterator[Path]:
    yield from listed
    yield from stem.parent.glob(f"{stem.name}-*{suffix}")
