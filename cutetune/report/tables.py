"""The report's sections as tables: what `--format md` prints, and what the notebook shows
under each figure. Each section's table is empty when the database holds nothing for it; the
section then shows its one-line `empty` note instead."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from cutetune.bench import COPY_NAME, DEFAULT_NAME, OURS, TUNED_NAME
from cutetune.device.funnel import PRUNE_FACTOR
from cutetune.report.data import ReportData, is_device, knob_columns
from cutetune.serving.plan import BORROWED, DEFAULT, NEAREST, PREDICTED, SHIPPED, TUNED

# The trial counts after which the search table reads the best found so far.
SEARCH_CHECKPOINTS = (1, 4, 8)


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    table: Callable[[ReportData], pd.DataFrame]
    empty: str


def environment(data: ReportData) -> pd.DataFrame:
    """Each device fingerprint with its measured ceilings; `reported` marks the report's."""
    devices = data.devices.copy()
    if devices.empty:
        return devices
    return devices.assign(reported=False if data.device is None
                          else is_device(devices, data.device))


def coverage(data: ReportData) -> pd.DataFrame:
    """Problem x bucket: T tuned, S shipped, N<b> served by tuned bucket b, B borrowed from
    another problem's winner, P the calibrated model's predicted best, D default; with
    the winners stored for an older kernel source, which the dispatcher no longer serves."""
    if data.coverage.empty:
        return pd.DataFrame()
    letters = {TUNED: "T", SHIPPED: "S", BORROWED: "B", PREDICTED: "P", DEFAULT: "D"}
    cells = data.coverage.assign(cell=[
        f"N{int(row.tuned_bucket)}" if row.source == NEAREST else letters[row.source]
        for row in data.coverage.itertuples()])
    table = cells.pivot(index="problem", columns="bucket", values="cell")
    table = table.reindex(list(dict.fromkeys(cells["problem"])))
    stale = data.winners.loc[~data.winners["current_source"]].groupby("problem").size()
    return table.assign(stale_winners=stale.reindex(table.index).fillna(0).astype(int))


def rejected_winners(data: ReportData) -> pd.DataFrame:
    """The stored winners the serving plan rejects, with the constraint's reason: they are
    tuned, but today's space refuses them, so their buckets are served otherwise."""
    return data.rejected[["problem", "bucket", "source", "config_json", "field", "reason"]]


def bench_times(data: ReportData) -> pd.DataFrame:
    """Median microseconds of every implementation benched, per problem and token count."""
    if data.bench.empty:
        return pd.DataFrame()
    table = data.bench.pivot_table(index=["problem", "num_tokens"], columns="implementation",
                                   values="median_us", sort=False)
    ordered = [name for name in (TUNED_NAME, DEFAULT_NAME) if name in table.columns]
    ordered += sorted(c for c in table.columns if c not in (*OURS, COPY_NAME))
    ordered += [COPY_NAME] if COPY_NAME in table.columns else []
    return table[ordered].sort_index(level=["problem", "num_tokens"],
                                     sort_remaining=False).reset_index()


def speedups(data: ReportData) -> pd.DataFrame:
    """Per problem and token count: the tuned kernel's speedup over the heuristic default and
    over the fastest peer (any implementation that is neither ours nor the copy)."""
    times = bench_times(data)
    if times.empty or TUNED_NAME not in times.columns:
        return pd.DataFrame()
    peers = [c for c in times.columns
             if c not in ("problem", "num_tokens", *OURS, COPY_NAME)]
    rows = []
    for row in times.to_dict("records"):
        timed_peers = {name: row[name] for name in peers if pd.notna(row[name])}
        best_peer = min(timed_peers, key=timed_peers.get) if timed_peers else None
        default_us = row.get(DEFAULT_NAME, float("nan"))
        rows.append({
            "problem": row["problem"], "num_tokens": row["num_tokens"],
            "tuned_us": row[TUNED_NAME], "default_us": default_us,
            "best_peer": best_peer,
            "best_peer_us": timed_peers.get(best_peer, float("nan")),
            "over_default": default_us / row[TUNED_NAME],
            "over_best_peer": timed_peers.get(best_peer, float("nan")) / row[TUNED_NAME],
        })
    return pd.DataFrame(rows)


def winner_configs(data: ReportData) -> pd.DataFrame:
    """Per problem, one row per knob of its winners and one each for their time and percent
    of the roofline, one column per bucket: how the choice moves from decode to prefill."""
    if data.winners.empty:
        return pd.DataFrame()
    knobs = knob_columns(data.winners)
    rows = []
    for problem, winners in data.winners.groupby("problem", sort=False):
        by_bucket = winners.set_index("bucket").sort_index()
        for knob in [k for k in knobs if by_bucket[k].notna().any()]:
            rows.append({"problem": problem, "row": knob,
                         **{b: _whole(v) for b, v in by_bucket[knob].items()}})
        rows.append({"problem": problem, "row": "median us", **by_bucket["median_us"]})
        rows.append({"problem": problem, "row": "% roofline", **by_bucket["pct_roofline"]})
    return pd.DataFrame(rows)


def _whole(value: object) -> object:
    """A knob's value as the config holds it: the frame of every kernel's knobs reads a
    missing knob as NaN, which turns integer columns into floats."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def best_so_far(trials: pd.DataFrame) -> pd.DataFrame:
    """Per run and trial number k (from 1): the best time found in the first k trials, and
    its ratio to the run's best (1.0 once the best is found; regret is ratio - 1)."""
    if trials.empty:
        return pd.DataFrame(columns=["run_id", "problem", "kernel_name", "bucket", "k",
                                     "best_us", "ratio", "exhaustive"])
    ordered = trials.sort_values(["run_id", "number"])
    ok_us = ordered["median_us"].where(ordered["status"] == "ok")
    best = ok_us.groupby(ordered["run_id"]).cummin()
    frame = ordered[["run_id", "problem", "kernel_name", "bucket", "exhaustive"]].assign(
        k=ordered.groupby("run_id").cumcount() + 1, best_us=best)
    final = frame.groupby("run_id")["best_us"].transform("min")
    return frame.assign(ratio=frame["best_us"] / final)


def search(data: ReportData) -> pd.DataFrame:
    """Per problem: the studies, their trials, how many tried every candidate, and the best
    found after k trials as a ratio to the study's best (median over studies)."""
    curves = best_so_far(data.trials)
    if curves.empty:
        return pd.DataFrame()
    first_best = curves[curves["ratio"] == 1.0].groupby("run_id")["k"].min()
    runs = curves.groupby("run_id").agg(problem=("problem", "first"), trials=("k", "max"),
                                        exhaustive=("exhaustive", "first"))
    runs = runs.assign(best_at=first_best)
    table = runs.groupby("problem", sort=False).agg(
        studies=("trials", "size"), median_trials=("trials", "median"),
        exhaustive=("exhaustive", "sum"), median_trial_of_best=("best_at", "median"))
    for k in SEARCH_CHECKPOINTS:
        at_k = curves[curves["k"] == k].groupby("problem", sort=False)["ratio"].median()
        table[f"best/final after {k}"] = at_k
    return table.reset_index()


def roofline(data: ReportData) -> pd.DataFrame:
    """Per kernel: measured over predicted time of every measured trial, its median, the
    median error, and the share of trials the prediction missed by more than the factor the
    planner prunes at; beside them the same errors of the device's calibrated model, where
    `cutetune calibrate` stored one."""
    measured = roofline_points(data)
    if measured.empty:
        return pd.DataFrame()
    frame = measured.assign(**_errors(measured["median_us"] / measured["predicted_us"]),
                            **_errors(measured["median_us"] / measured["calibrated_us"],
                                      "calibrated "))
    groups = [*frame.groupby("kernel_name", sort=False), ("all", frame)]
    calibrated = measured["calibrated_us"].notna().any()
    return pd.DataFrame([{"kernel": name, "trials": len(rows),
                          "median measured/predicted": rows["ratio"].median(),
                          "median error %": rows["error"].median(),
                          f"% off by over {PRUNE_FACTOR:g}x": rows["missed"].mean(),
                          **({"calibrated: median error %": rows["calibrated error"].median(),
                              f"calibrated: % off by over {PRUNE_FACTOR:g}x":
                                  rows["calibrated missed"].mean()} if calibrated else {})}
                         for name, rows in groups])


def _errors(ratio: pd.Series, prefix: str = "") -> dict[str, pd.Series]:
    missed = (ratio > PRUNE_FACTOR) | (ratio < 1 / PRUNE_FACTOR)
    return {f"{prefix}ratio": ratio, f"{prefix}error": (ratio - 1).abs() * 100,
            f"{prefix}missed": missed * 100}


def roofline_points(data: ReportData) -> pd.DataFrame:
    """The trials with both a measurement and a prediction."""
    trials = data.trials
    if trials.empty:
        return trials
    return trials[(trials["status"] == "ok") & trials["predicted_us"].notna()]


def failures(data: ReportData) -> pd.DataFrame:
    """Failed trials per kernel and reason (the reason's text up to its first colon: hang,
    crash, cuda, a verification failure ...), with one full reason as an example."""
    failed = data.trials[data.trials["status"] == "failed"] if not data.trials.empty else None
    if failed is None or failed.empty:
        return pd.DataFrame()
    kind = failed["failure_reason"].str.split(":").str[0].str.strip()
    return (failed.assign(reason=kind)
            .groupby(["kernel_name", "reason"], sort=True)
            .agg(trials=("number", "size"), example=("failure_reason", "first"))
            .reset_index())


SECTIONS: tuple[Section, ...] = (
    Section("environment", "Environment and measured ceilings", environment,
            "No device in the database: nothing was tuned or benched yet."),
    Section("coverage", "Coverage: what each bucket is served (T tuned, S shipped, N<b> the "
            "nearest tuned bucket b, B borrowed from another problem's winner, P the calibrated "
            "cost model's predicted best, D the heuristic default)", coverage,
            "No coverage: the database holds no device to plan for."),
    Section("rejected", "Coverage: stored winners the plan rejects (today's space refuses "
            "them), with the constraint's reason", rejected_winners,
            "No stored winner is rejected: every current one is served."),
    Section("bench", "Time vs tokens: tuned, default, every peer, the copy of the same bytes "
            "and the launch floor", bench_times,
            "No bench rows for this model and device (run `cutetune bench`)."),
    Section("speedup", "Speedup of tuned over the default and over the best peer", speedups,
            "No bench rows with a tuned time for this model and device (run `cutetune bench`)."),
    Section("winners", "The winners' configurations per bucket", winner_configs,
            "No winners stored for this model and device (run `cutetune tune`)."),
    Section("search", "Search: best so far vs trial number, and the regret of exhaustively "
            "searched buckets", search,
            "No tuning trials stored for this model and device."),
    Section("roofline", "Roofline: predicted vs measured time of every trial, by the datasheet "
            "roofline and, where one is stored, the calibrated model", roofline,
            "No measured trial with a prediction for this model and device."),
    Section("failures", "Failures per kernel and reason", failures,
            "No failed trials for this model and device."),
)


def section(key: str) -> Section:
    return next(s for s in SECTIONS if s.key == key)
