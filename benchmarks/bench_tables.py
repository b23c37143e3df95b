"""Markdown tables for BENCHMARKS.md from `cutetune bench --out` CSV files: one row per problem
and token count, microseconds per implementation side by side, then ours as a percentage of the
copy ceiling and of a copy of the same bytes, and ours over the best peer. The problem fields
every row shares are stated once above the table; the rows name only the fields that vary.

    python3 -m benchmarks.bench_tables bench-*.csv
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import pandas as pd

OURS = ("cutetune tuned", "cutetune default")
COPY = "copy, same bytes"


def shared_fields(problems: Sequence[dict]) -> dict:
    """The fields every problem of a table has with one value, in the first problem's order."""
    return {key: value for key, value in problems[0].items()
            if all(key in p and p[key] == value for p in problems)}


def shared_line(shared: dict) -> str:
    """The line under a table's heading that states its rows' shared fields once ("" if
    none)."""
    if not shared:
        return ""
    return "All rows: " + ", ".join(f"{key} {value}" for key, value in shared.items()) + ".\n\n"


def label(fields: dict, shared: dict) -> str:
    """A row's problem cell: its fields the shared line does not state, in its own order."""
    return " ".join(f"{key}={value}" for key, value in fields.items() if key not in shared)


def table(frame: pd.DataFrame) -> str:
    """The shared fields' line, then the table (without a problem column where every row is
    of one problem)."""
    problems = {text: json.loads(text) for text in frame["problem"].unique()}
    shared = shared_fields(list(problems.values()))
    frame = frame.assign(problem=frame["problem"].map(lambda t: label(problems[t], shared)))
    us = frame.pivot_table(index=["problem", "tokens"], columns="implementation", values="us",
                           sort=False)
    pct = frame.pivot_table(index=["problem", "tokens"], columns="implementation",
                            values="pct_of_copy", sort=False)
    # A run without a tuned DB has no timed "cutetune tuned" row at all: ours is the default.
    for name in OURS:
        us[name] = us.get(name, pd.Series(float("nan"), index=us.index))
        pct[name] = pct.get(name, pd.Series(float("nan"), index=pct.index))
    implementations = [c for c in frame["implementation"].unique() if c in us.columns]
    peers = [c for c in implementations if c not in (*OURS, COPY)]
    ours = us["cutetune tuned"].fillna(us["cutetune default"])
    # Where every row is of one problem, its fields are all in the shared line.
    varying = len(problems) > 1
    problem_column = ["problem"] if varying else []
    head = [*problem_column, "tokens", *implementations, "ours % of copy ceiling",
            "ours % of same-bytes copy", "ours vs best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in us.index:
        cells = [f"{us.loc[key, c]:.2f}" if pd.notna(us.loc[key, c]) else "-"
                 for c in implementations]
        ours_pct = pct.loc[key, "cutetune tuned"] if pd.notna(
            pct.loc[key, "cutetune tuned"]) else pct.loc[key, "cutetune default"]
        best_peer = us.loc[key, peers].min()
        problem = [key[0]] if varying else []
        lines.append("| " + " | ".join([*problem, str(key[1]), *cells, f"{ours_pct:.1f}%",
                                        f"{100 * us.loc[key, COPY] / ours[key]:.1f}%",
                                        f"{best_peer / ours[key]:.2f}x"]) + " |")
    return shared_line(shared) + "\n".join(lines)


def main() -> None:
    frame = pd.concat(pd.read_csv(path) for path in sys.argv[1:])
    for kernel, rows in frame.groupby("kernel", sort=False):
        ceilings = ", ".join(f"{c:.0f}" for c in sorted(rows["copy_gbps"].unique()))
        empty = ", ".join(f"{e:.2f}" for e in sorted(rows["empty_kernel_us"].unique()))
        print(f"### {kernel} (us per call; copy ceiling {ceilings} GB/s; empty kernel {empty} "
              "us)\n")
        print(table(rows) + "\n")


if __name__ == "__main__":
    main()
