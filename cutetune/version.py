"""The package's version, written in this one place: pyproject.toml reads it, so a checkout run
from source (on PYTHONPATH, not installed) knows its version as well as an installed one."""

__version__ = "0.1.0"
