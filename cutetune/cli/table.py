"""The one way the command line prints a table."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def render_table(header: Sequence[str], rows: Iterable[Sequence[str]], *,
                 right: Collection[str] = (), indent: str = "") -> str:
    """`rows` of cells under `header`, each column as wide as its widest cell and two spaces
    from the next; the columns named in `right` (numbers) right-aligned, the others left.
    Each line starts with `indent` and ends without trailing spaces."""
    lines = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    aligned = [str.rjust if name in right else str.ljust for name in header]
    return "\n".join(
        indent + "  ".join(align(cell, width)
                           for cell, width, align in zip(line, widths, aligned, strict=True))
        .rstrip() for line in lines)
