"""Settings read from the environment, in one place.

CUTETUNE_DB         SQLAlchemy URL of the results database
                    (default: sqlite:///<cache dir>/cutetune.db)
CUTETUNE_CACHE_DIR  where the default database lives (default: ~/.cache/cutetune,
                    or $XDG_CACHE_HOME/cutetune)

A leading `~` in a directory (or in a SQLite URL's path, see results_db.session) is the home
directory, as a shell would expand it, never a folder named `~`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    db_url: str
    cache_dir: Path
    # Whether db_url is the default file (CUTETUNE_DB unset): on a fresh machine nothing has
    # created it yet, which a command that can do without stored winners may accept, while a
    # URL someone gave that names no file is a mistake.
    db_is_default: bool = False


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    xdg = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    cache_dir = Path(env.get("CUTETUNE_CACHE_DIR") or xdg / "cutetune").expanduser()
    given = env.get("CUTETUNE_DB")
    db_url = given or f"sqlite:///{cache_dir / 'cutetune.db'}"
    return Settings(db_url=db_url, cache_dir=cache_dir, db_is_default=not given)
