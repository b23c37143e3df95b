"""The report's figures, drawn with matplotlib from the same frames as its tables, and `show`,
which puts one section (title, figure, table, or its no-data note) into a notebook.

Figures are made as `Figure` objects, not through pyplot, so that no backend is chosen and no
figure is kept open: the same code draws in a notebook, a headless run and a test."""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from cutetune.bench import COPY_NAME, TUNED_NAME
from cutetune.device.funnel import PRUNE_FACTOR
from cutetune.report.data import ReportData
from cutetune.report.tables import (
    best_so_far,
    coverage,
    roofline_points,
    section,
    speedups,
)
from cutetune.serving.plan import BORROWED, DEFAULT, NEAREST, PREDICTED, SHIPPED, TUNED

SOURCES = (TUNED, SHIPPED, NEAREST, BORROWED, PREDICTED, DEFAULT)
SOURCE_COLOURS = ("#2ca02c", "#1f77b4", "#ffbf00", "#17becf", "#9467bd", "#d62728")


def draw_coverage(data: ReportData) -> Figure:
    """Problem x bucket, coloured by what serves the bucket; a nearest cell names its bucket."""
    table = coverage(data).drop(columns="stale_winners")
    codes = data.coverage.pivot(index="problem", columns="bucket", values="source")
    codes = codes.reindex(table.index).map(SOURCES.index)
    fig = Figure(figsize=(1.5 + 0.55 * len(table.columns), 1.2 + 0.45 * len(table)),
                 layout="constrained")
    ax = fig.subplots()
    ax.imshow(codes.to_numpy(dtype=float), cmap=ListedColormap(SOURCE_COLOURS), vmin=-0.5,
              vmax=len(SOURCES) - 0.5, aspect="auto")
    for (y, x), cell in np.ndenumerate(table.to_numpy()):
        ax.text(x, y, cell, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(table.columns)), [str(b) for b in table.columns], rotation=90)
    ax.set_yticks(range(len(table)), table.index)
    ax.set_xlabel("token bucket")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in SOURCE_COLOURS]
    ax.legend(handles, SOURCES, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(f"{data.model}: what the dispatcher serves per bucket")
    return fig


def draw_bench(data: ReportData) -> Figure:
    """Per problem: time vs tokens of every implementation with the same-bytes copy and the
    launch floor as lines (top), and each one's percent of the copy ceiling (bottom)."""
    problems = list(dict.fromkeys(data.bench["problem"]))
    fig = Figure(figsize=(4.5 * len(problems), 7), layout="constrained")
    axes = fig.subplots(2, len(problems), squeeze=False, sharex="col")
    floor = data.ceilings.get("launch_floor_us")
    for column, problem in enumerate(problems):
        rows = data.bench[data.bench["problem"] == problem]
        time_ax, pct_ax = axes[0, column], axes[1, column]
        for name, timed in rows.groupby("implementation", sort=False):
            timed = timed.sort_values("num_tokens")
            style = ({"color": "black", "linestyle": "--"} if name == COPY_NAME else
                     {"linewidth": 2.5} if name == TUNED_NAME else {"alpha": 0.8})
            time_ax.plot(timed["num_tokens"], timed["median_us"], marker=".", label=name,
                         **style)
            if name != COPY_NAME:
                pct_ax.plot(timed["num_tokens"], timed["pct_of_copy"], marker=".", label=name,
                            **style)
        if floor is not None:
            time_ax.axhline(floor, color="grey", linestyle=":", label="launch floor")
        time_ax.set(xscale="log", yscale="log", title=problem, ylabel="median time (us)")
        pct_ax.set(xscale="log", xlabel="tokens", ylabel="% of the copy ceiling")
        pct_ax.axhline(100, color="black", linestyle="--", linewidth=0.8)
        time_ax.legend(fontsize=7)
    return fig


def draw_speedup(data: ReportData) -> Figure:
    """Per problem: tuned over default and over the best peer, vs tokens."""
    table = speedups(data)
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    for problem, rows in table.groupby("problem", sort=False):
        line, = ax.plot(rows["num_tokens"], rows["over_best_peer"], marker="o",
                        label=f"{problem}: over the best peer")
        ax.plot(rows["num_tokens"], rows["over_default"], marker="x", linestyle="--",
                color=line.get_color(), label=f"{problem}: over the default")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xscale="log", xlabel="tokens", ylabel="speedup of tuned (x)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_search(data: ReportData) -> Figure:
    """Best so far over the study's best vs trial number, one line per study (left), and the
    regret after k trials of the studies that tried every candidate (right)."""
    curves = best_so_far(data.trials)
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    colours = dict(zip(dict.fromkeys(curves["problem"]), matplotlib.colormaps["tab10"].colors,
                       strict=False))
    for (problem, _), run in curves.groupby(["problem", "run_id"], sort=False):
        left.plot(run["k"], run["ratio"], color=colours[problem], alpha=0.4, linewidth=1)
    exhaustive = curves[curves["exhaustive"]]
    for problem, runs in exhaustive.groupby("problem", sort=False):
        for _, run in runs.groupby("run_id"):
            right.plot(run["k"], (run["ratio"] - 1) * 100, color=colours[problem], alpha=0.3)
        median = runs.groupby("k")["ratio"].median()
        right.plot(median.index, (median - 1) * 100, color=colours[problem], linewidth=2.5,
                   label=f"{problem} (median of {runs['run_id'].nunique()})")
    left.set(xlabel="trial number", ylabel="best so far / study's best",
             title="every study")
    left.legend([Line2D([], [], color=c) for c in colours.values()], list(colours),
                fontsize=7)
    right.set(xlabel="trials k", ylabel="regret after k trials (%)",
              title="studies that tried every candidate")
    if exhaustive.empty:
        right.text(0.5, 0.5, "no bucket was searched exhaustively", ha="center",
                   transform=right.transAxes)
    else:
        right.legend(fontsize=7)
    return fig


def draw_roofline(data: ReportData) -> Figure:
    """Predicted vs measured time of every measured trial, per kernel, with the lines where
    the prediction is off by the planner's prune factor."""
    points = roofline_points(data)
    fig = Figure(figsize=(7, 6), layout="constrained")
    ax = fig.subplots()
    for kernel, rows in points.groupby("kernel_name", sort=False):
        ax.scatter(rows["predicted_us"], rows["median_us"], s=8, alpha=0.5, label=kernel)
    low = min(points["predicted_us"].min(), points["median_us"].min()) / 2
    high = max(points["predicted_us"].max(), points["median_us"].max()) * 2
    span = np.array([low, high])
    ax.plot(span, span, color="black", linewidth=1, label="measured = predicted")
    for factor in (PRUNE_FACTOR, 1 / PRUNE_FACTOR):
        ax.plot(span, span * factor, color="grey", linestyle="--", linewidth=1)
    ax.plot([], [], color="grey", linestyle="--",
             label=f"off by the prune factor ({PRUNE_FACTOR:g}x)")
    error = ((points["median_us"] / points["predicted_us"]) - 1).abs().median() * 100
    ax.set(xscale="log", yscale="log", xlabel="predicted (us)", ylabel="measured median (us)",
           title=f"roofline: median error {error:.0f}% over {len(points)} trials")
    ax.legend(fontsize=7)
    return fig


# The sections drawn as a figure; the others are tables alone.
FIGURES: dict[str, Callable[[ReportData], Figure]] = {
    "coverage": draw_coverage,
    "bench": draw_bench,
    "speedup": draw_speedup,
    "search": draw_search,
    "roofline": draw_roofline,
}


def show(key: str, data: ReportData) -> None:
    """Display one section in a notebook: its title, then its figure and table, or the
    one line saying it has no data."""
    from IPython.display import Image, Markdown, display

    shown = section(key)
    table = shown.table(data)
    display(Markdown(f"## {shown.title}"))
    if table.empty:
        display(Markdown(shown.empty))
        return
    if key in FIGURES:
        display(Image(png(FIGURES[key](data))))
    display(table)


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (what the notebook embeds, whatever backend it runs)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
