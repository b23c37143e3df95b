"""Settings read from the environment, in one place.

CUTETUNE_DB         SQLAlchemy URL of the results database
                    (default: sqlite:///<cache dir>/cutetune.db)
CUTETUNE_CACHE_DIR  where the default database lives (default: ~/.cache/cutetune,
                    or $XDG_CACHE_HOME/cutetune)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    db_url: str
    cache_dir: Path


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    cache_dir = Path(env.get("CUTETUNE_CACHE_DIR") or Path(xdg) / "cutetune")
    db_url = env.get("CUTETUNE_DB") or f"sqlite:///{cache_dir / 'cutetune.db'}"
    return Settings(db_url=db_url, cache_dir=cache_dir)
