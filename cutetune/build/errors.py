"""What a build or a launch failure says, in one line."""

from __future__ import annotations

import re

# CuTeDSL colours its messages for a terminal; a stored failure reason is plain text.
_COLOUR_CODE = re.compile(r"\x1b\[[0-9;]*m")


def first_line(err: Exception) -> str:
    """The first line of an error's message, without the colour codes CuTeDSL puts in."""
    text = _COLOUR_CODE.sub("", str(err)).strip()
    return text.splitlines()[0] if text else type(err).__name__
