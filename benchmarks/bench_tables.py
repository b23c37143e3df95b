"""Markdown tables for BENCHMARKS.md from `cutetune bench --out` CSV files: one row per problem
and token count, microseconds per implementation side by side, then ours as a percentage of the
copy ceiling and of a copy of the same bytes, and ours over the best peer.

    python3 -m benchmarks.bench_tables bench-*.csv
"""

from __future__ import annotations

import json
import sys

import pandas as pd

OURS = ("cutetune tuned", "cutetune default")
COPY = "copy, same bytes"
# Problem fields that every row of a table shares are left out of its label.
SHARED = ("dtype", "out_dtype", "eps", "weight_bias")


def label(problem_json: str) -> str:
    fields = json.loads(problem_json)
    return " ".join(f"{k}={v}" for k, v in fields.items() if k not in SHARED)


def table(frame: pd.DataFrame) -> str:
    frame = frame.assign(problem=frame["problem"].map(label))
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
    head = ["problem", "tokens", *implementations, "ours % of copy ceiling",
            "ours % of same-bytes copy", "ours vs best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in us.index:
        cells = [f"{us.loc[key, c]:.2f}" if pd.notna(us.loc[key, c]) else "-"
                 for c in implementations]
        ours_pct = pct.loc[key, "cutetune tuned"] if pd.notna(
            pct.loc[key, "cutetune tuned"]) else pct.loc[key, "cutetune default"]
        best_peer = us.loc[key, peers].min()
        lines.append("| " + " | ".join([key[0], str(key[1]), *cells, f"{ours_pct:.1f}%",
                                        f"{100 * us.loc[key, COPY] / ours[key]:.1f}%",
                                        f"{best_peer / ours[key]:.2f}x"]) + " |")
    return "\n".join(lines)


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
