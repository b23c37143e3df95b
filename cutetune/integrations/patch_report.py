"""What a patch did, module by module: the record `patch` returns and prints as a table."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# Decoder layers repeat: one table row stands for every layer whose entry reads the same.
_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")


@dataclass(frozen=True)
class PatchEntry:
    """One module: what serves it now (`op`), whether cutetune replaced its forward, and why
    not where it did not."""

    module: str
    op: str
    replaced: bool
    note: str = ""


@dataclass(frozen=True)
class PatchReport:
    family: str
    entries: tuple[PatchEntry, ...]
    warmup: str

    @property
    def replaced(self) -> tuple[PatchEntry, ...]:
        return tuple(e for e in self.entries if e.replaced)

    @property
    def left_alone(self) -> tuple[PatchEntry, ...]:
        return tuple(e for e in self.entries if not e.replaced)

    def __str__(self) -> str:
        rows = Counter(
            (_LAYER_INDEX.sub(".*", e.module), e.op, "replaced" if e.replaced else "left alone",
             e.note) for e in self.entries)
        table = [("module", "count", "op", "status", "note")] + [
            (module, str(count), op, status, note)
            for (module, op, status, note), count in rows.items()]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        lines = [f"cutetune patch of a {self.family} model: {len(self.replaced)} modules "
                 f"replaced, {len(self.left_alone)} left alone; warmup: {self.warmup}"]
        for row in table:
            cells = (cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
            lines.append("  ".join(cells) + "  " + row[4])
        return "\n".join(line.rstrip() for line in lines)
