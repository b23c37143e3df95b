"""The report's tables as one Markdown document (`cutetune report --format md`)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from cutetune.report.data import ReportData
from cutetune.report.tables import SECTIONS, Section


def render_markdown(data: ReportData,
                    on_section: Callable[[Section], None] | None = None) -> str:
    """Every section's title and table (or its one-line note where it has no data)."""
    parts = [f"# Tuning report: {data.describe()}", data.summary()]
    for section in SECTIONS:
        if on_section is not None:
            on_section(section)
        table = section.table(data)
        parts.append(f"## {section.title}")
        parts.append(section.empty if table.empty else markdown_table(table))
    return "\n\n".join(parts) + "\n"


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of `frame` (its index too, where it is named)."""
    if frame.index.name is not None:
        frame = frame.reset_index()
    header = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(value) for value in row) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")
