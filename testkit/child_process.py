"""The environment of a Python child process a test starts (`subprocess`, not multiprocessing's
spawn, which passes the parent's path itself): the parent's sys.path as its PYTHONPATH, so that
it imports `testkit` and the tests' own modules as the parent does, wherever pytest ran from."""

from __future__ import annotations

import os
import sys


def child_env(**extra: str) -> dict[str, str]:
    """os.environ, with PYTHONPATH the parent's sys.path, and `extra` set."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **extra}
