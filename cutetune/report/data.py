"""What the tuning report reads: one model's rows of the results database, as frames.

Only the database is read (winners, trials, ceilings, bench rows); the kernels are imported for
the model's problems, and the dispatcher and the device model's funnel are asked which bucket each
winner serves and which buckets were searched exhaustively, so that the report shows what
cutetune itself would do rather than a second reading of its rules.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import pandas as pd

from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import candidates_of, make_plan
from cutetune.device.specs import Ceilings, device_spec_for
from cutetune.kernels.registry import KernelDef, NotApplicableError, get_kernel, kernel_names
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    Winner,
    bench_frame,
    calibration_to_serve,
    devices_frame,
    latest_ceilings,
    shipped_winners,
    trials_frame,
    winners_frame,
    winners_to_serve,
    winners_with_devices,
)
from cutetune.serving.plan import ServingPlan
from cutetune.spaces.buckets import DEFAULT_TUNE_TOKENS, check_bucket
from cutetune.spaces.models import load_model
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

log = logging.getLogger("cutetune.report")

# The buckets the coverage map shows: those `cutetune tune` tunes by default.
COVERAGE_BUCKETS = DEFAULT_TUNE_TOKENS


@dataclass(frozen=True)
class ModelProblem:
    """One static problem of the model, with the short label the report's figures use."""

    kernel: KernelDef
    problem: Problem
    label: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kernel.name, self.problem.static_key())


@dataclass(frozen=True)
class ReportData:
    """The frames of one model's report on one device. Every frame but `devices` holds only
    the rows of the model's problems on `device`, each row labelled with its `problem`.

    devices:  every device fingerprint with its latest ceilings (copy_gbps, launch_floor_us)
    coverage: kernel, problem, bucket, source (tuned/shipped/nearest/predicted/default),
              tuned_bucket
    rejected: the stored winners of the current kernel source that the serving plan rejects
              (today's space refuses them): problem, bucket, source (tuned/shipped), config,
              the field at fault and the constraint's reason
    winners:  the stored winners, the config's knobs as columns
    trials:   every trial, with `exhaustive` (its run tried every candidate of the plan)
    bench:    the latest bench row of each problem, token count and implementation
    """

    model: str
    device: DeviceFingerprint | None
    problems: tuple[ModelProblem, ...]
    devices: pd.DataFrame
    coverage: pd.DataFrame
    rejected: pd.DataFrame
    winners: pd.DataFrame
    trials: pd.DataFrame
    bench: pd.DataFrame

    @property
    def ceilings(self) -> dict[str, float]:
        """The reported device's latest ceilings."""
        if self.device is None or self.devices.empty:
            return {}
        row = self.devices[is_device(self.devices, self.device)]
        values = row.iloc[0].drop([f.name for f in fields(DeviceFingerprint)]).dropna()
        return {str(name): float(value) for name, value in values.items()}

    def describe(self) -> str:
        where = "no device in the database" if self.device is None else (
            f"{self.device.gpu_name} (cc {self.device.compute_capability}, "
            f"{self.device.sm_count} SMs, driver {self.device.driver}, CUDA {self.device.cuda}, "
            f"torch {self.device.torch}, CuTeDSL {self.device.cutlass_dsl})")
        return f"{self.model} on {where}"

    def summary(self) -> str:
        """One line of what the database holds for the model; says so when nothing is
        tuned."""
        if self.winners.empty and self.trials.empty:
            return (f"Nothing is tuned for {self.model} in this database"
                    + ("" if self.device is None else " on this device")
                    + f"; {len(self.bench)} bench rows.")
        stale = int((~self.winners["current_source"]).sum())
        return (f"{len(self.winners)} winners ({stale} of an older kernel source, which the "
                f"dispatcher does not serve), {len(self.trials)} trials in "
                f"{self.trials['run_id'].nunique()} tuning runs, {len(self.bench)} bench rows.")


def model_problems(model: str, dtype: str = "bfloat16") -> tuple[ModelProblem, ...]:
    """The static problems of every kernel the model uses. Raises UnknownModelError (a
    ValueError) for a name that is no preset and no readable config.json."""
    shape = load_model(model)
    found: list[tuple[KernelDef, Problem]] = []
    for name in kernel_names():
        kernel = get_kernel(name)
        try:
            found.extend((kernel, problem) for problem in kernel.problems_for_model(shape, dtype))
        # Not used by the model, or at sizes the kernel cannot serve: nothing of it to report.
        except (NotApplicableError, ValueError):
            continue
    return tuple(ModelProblem(kernel, problem, _label(kernel, problem, found))
                 for kernel, problem in found)


def _label(kernel: KernelDef, problem: Problem, found: list[tuple[KernelDef, Problem]]) -> str:
    """The kernel's name, and the static fields that tell its problems in the model apart."""
    siblings = [p.static_fields() for k, p in found if k.name == kernel.name]
    own = problem.static_fields()
    differing = [f"{name}={value}" for name, value in own.items()
                 if any(other[name] != value for other in siblings)]
    return " ".join([kernel.name, *differing])


def load_report_data(db_url: str, model: str, device: str | None = None,
                     dtype: str = "bfloat16") -> ReportData:
    """Read the report's frames for `model` from the database at `db_url` (opened read-only).

    `device` picks the device fingerprint by (part of) its GPU name; by default, the one with
    the most winners for the model. Raises ValueError for an unknown model or a device that
    no fingerprint names.
    """
    problems = model_problems(model, dtype)
    db = Database.open(db_url, read_only=True)
    try:
        devices = devices_frame(db)
        # None where the database holds no device, and so no winner, trial or bench row.
        fingerprint = _pick_device(db, devices, problems, device)
        spec = _spec_of(fingerprint)
        # What a warmup on this device would serve, from the winners it would read; None
        # without a device, or for a GPU without a DeviceSpec, which cannot be planned for.
        calibrated = None if spec is None else calibration_to_serve(db, fingerprint)
        plan = None if spec is None else ServingPlan(
            spec, winners_to_serve(db, fingerprint), shipped_winners(fingerprint),
            calibrated=calibrated)
        rejected = _rejected(plan, problems)
        usable = _usable_check(rejected)
        winners = _of_model(winners_frame(db, fingerprint), problems)
        return ReportData(
            model, fingerprint, problems, devices, _coverage(plan, problems), rejected,
            _with_knobs(winners[pd.Series([usable(row) for row in winners.itertuples()],
                                          index=winners.index, dtype=bool)]
                        .reset_index(drop=True), problems),
            _with_calibrated(_with_exhaustive(db, _usable_trials(_of_model(
                trials_frame(db, fingerprint=fingerprint), problems)), problems, fingerprint),
                problems, spec, calibrated),
            _latest(_of_model(bench_frame(db, fingerprint), problems)))
    finally:
        db.dispose()


def is_device(devices: pd.DataFrame, fingerprint: DeviceFingerprint) -> pd.Series:
    """Which rows of `devices` (a devices_frame) are `fingerprint`."""
    rows = pd.Series(True, index=devices.index)
    for name, value in asdict(fingerprint).items():
        rows &= devices[name] == value
    return rows


def devices_named(devices: pd.DataFrame, wanted: str | None) -> list[DeviceFingerprint]:
    """The fingerprints of `devices` (a devices_frame) whose GPU name contains `wanted` in any
    case, or whose GPU the device table names `wanted` (the CLI's --device: 'H100 SXM' is the
    NVIDIA H100 80GB HBM3); all of them when it is None. Raises ValueError, naming the GPUs
    there are, where a name matches none."""
    names = [f.name for f in fields(DeviceFingerprint)]
    fingerprints = [DeviceFingerprint(**{n: row[n] for n in names})
                    for row in devices[names].to_dict("records")]
    if wanted is None:
        return fingerprints
    named = [f for f in fingerprints
             if wanted.lower() in f.gpu_name.lower() or _table_name(f.gpu_name) == wanted]
    if not named:
        known = sorted(set(devices["gpu_name"])) or ["none"]
        raise ValueError(f"no device in the database is named like {wanted!r}: the database "
                         f"holds {', '.join(known)}")
    return named


def _table_name(gpu_name: str) -> str | None:
    try:
        return device_spec_for(gpu_name).name
    except ValueError:
        return None


def _pick_device(db: Database, devices: pd.DataFrame, problems: tuple[ModelProblem, ...],
                 wanted: str | None) -> DeviceFingerprint | None:
    fingerprints = devices_named(devices, wanted)
    if not fingerprints:
        return None
    keys = {p.key for p in problems}
    counts = Counter(device for device, winner in winners_with_devices(db)
                     if (winner.kernel_name, winner.static_key) in keys)
    # The most winners of the model; among equals, the first stored.
    return max(fingerprints, key=lambda f: counts[f])


def _of_model(frame: pd.DataFrame, problems: tuple[ModelProblem, ...]) -> pd.DataFrame:
    """The rows of the model's problems, labelled; `frame` names kernels in `kernel_name`."""
    labels = {p.key: p.label for p in problems}
    keys = pd.Series(list(zip(frame["kernel_name"], frame["static_key"], strict=True)),
                     index=frame.index, dtype=object)
    kept = frame.loc[keys.isin(list(labels))].copy()
    kept.insert(0, "problem", keys[kept.index].map(labels))
    return kept.reset_index(drop=True)


def _empty_coverage() -> pd.DataFrame:
    return pd.DataFrame(columns=["kernel_name", "problem", "bucket", "source", "tuned_bucket"])


def _coverage(plan: ServingPlan | None, problems: tuple[ModelProblem, ...]) -> pd.DataFrame:
    """What the serving plan serves at each bucket; empty without a plan."""
    if plan is None:
        return _empty_coverage()
    rows = []
    for entry in problems:
        for bucket in COVERAGE_BUCKETS:
            served = plan.entry_for(entry.kernel, entry.problem.with_tokens(bucket))
            rows.append({"kernel_name": entry.kernel.name, "problem": entry.label,
                         "bucket": bucket, "source": served.source,
                         "tuned_bucket": served.tuned_bucket})
    return pd.DataFrame(rows, columns=list(_empty_coverage().columns))


_REJECTED_COLUMNS = ["kernel_name", "static_key", "problem", "bucket", "source", "config_json",
                     "field", "reason"]


def _rejected(plan: ServingPlan | None, problems: tuple[ModelProblem, ...]) -> pd.DataFrame:
    """The stored winners the plan rejects for the model's problems, each said in one line."""
    rows = []
    for entry in problems if plan is not None else ():
        for rejected in plan.rejected(entry.kernel, entry.problem):
            winner = rejected.winner
            log.warning("cutetune: the report leaves out the stored winner of %s at bucket %s: "
                        "%s", entry.label, winner.bucket, rejected.reason)
            rows.append({"kernel_name": winner.kernel_name, "static_key": winner.static_key,
                         "problem": entry.label, "bucket": winner.bucket,
                         "source": rejected.source, "config_json": winner.config_json,
                         "field": rejected.reason.field, "reason": rejected.reason.reason})
    return pd.DataFrame(rows, columns=_REJECTED_COLUMNS)


def _usable_check(rejected: pd.DataFrame) -> Callable[[Any], bool]:
    """A predicate over stored winners (a winners frame's rows): False for one the plan
    rejects, so that the report's tables leave it out as the coverage does."""
    refused = set(zip(rejected["kernel_name"], rejected["static_key"],
                      rejected["bucket"].astype(int), rejected["config_json"], strict=True))

    def usable(winner: Any) -> bool:
        return (winner.kernel_name, winner.static_key, int(winner.bucket),
                winner.config_json) not in refused

    return usable


def _usable_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials less those stored under a bucket outside the bucketing policy (no problem
    can be planned there), each such bucket left out in one line."""
    usable = pd.Series(True, index=trials.index, dtype=bool)
    for (problem, bucket), run in trials.groupby(["problem", "bucket"]):
        try:
            check_bucket(int(bucket))
        except ValueError as why:
            log.warning("cutetune: the report leaves out the %d stored trials of %s at "
                        "bucket %s: bucket: %s", len(run), problem, bucket, why)
            usable[run.index] = False
    return trials[usable].reset_index(drop=True)


def _with_calibrated(trials: pd.DataFrame, problems: tuple[ModelProblem, ...], spec,
                     calibrated: CalibratedModel | None) -> pd.DataFrame:
    """The trials with `calibrated_us`: the device's calibrated model's prediction of each
    (missing without a calibration, and for a config today's space does not read)."""
    if calibrated is None or trials.empty:
        return trials.assign(calibrated_us=float("nan"))
    by_key = {p.key: p for p in problems}

    def predicted(row) -> float:
        entry = by_key[(row.kernel_name, row.static_key)]
        try:
            config = entry.kernel.space.config_from_dict(json.loads(row.config_json))
        except (TypeError, ValueError):
            return float("nan")
        problem = entry.problem.with_tokens(int(row.bucket))
        return calibrated.predict_us(entry.kernel.cost(problem, config, spec), spec,
                                     (entry.kernel.name, problem.num_tokens, config))

    return trials.assign(calibrated_us=[predicted(row) for row in trials.itertuples()])


def _with_knobs(winners: pd.DataFrame, problems: tuple[ModelProblem, ...]) -> pd.DataFrame:
    """The winners with `current_source` (tuned from the kernel's current source, so the
    dispatcher serves them) and each knob of their configs as a column (empty where a kernel
    has no such knob)."""
    current = {p.kernel.name: p.kernel.source_hash() for p in problems}
    winners = winners.assign(current_source=pd.Series(
        [current[name] == source
         for name, source in zip(winners["kernel_name"], winners["source_hash"], strict=True)],
        index=winners.index, dtype=bool))
    knobs = pd.DataFrame([json.loads(text) for text in winners["config_json"]],
                         index=winners.index)
    return pd.concat([winners, knobs], axis=1)


def _with_exhaustive(db: Database, trials: pd.DataFrame, problems: tuple[ModelProblem, ...],
                     fingerprint: DeviceFingerprint | None) -> pd.DataFrame:
    """The trials with `exhaustive`: their run timed every candidate the tuner's plan (of the
    current kernel source) gives its bucket, so its best is the best of the whole space."""
    trials = trials.assign(exhaustive=False)
    spec = _spec_of(fingerprint)
    if spec is None:
        return trials
    measured = latest_ceilings(db, fingerprint)
    ceilings = Ceilings.from_measured(spec, {name: value for name, value in measured.items()
                                             if name in _CEILING_NAMES})
    by_key = {p.key: p for p in problems}
    exhaustive: dict[int, bool] = {}
    for (kernel_name, static_key, bucket), run in trials.groupby(
            ["kernel_name", "static_key", "bucket"]):
        entry = by_key[(kernel_name, static_key)]
        problem = entry.problem.with_tokens(int(bucket))
        candidates = {config_to_json(c) for c in candidates_of(
            make_plan(entry.kernel, problem, spec, ceilings),
            entry.kernel.default_config(problem, spec))}
        for run_id, tried in run.groupby("run_id"):
            exhaustive[run_id] = candidates <= set(tried["config_json"])
    trials["exhaustive"] = trials["run_id"].map(exhaustive).fillna(False).astype(bool)
    return trials


_CEILING_NAMES = {field.name for field in fields(Ceilings)} - {"measured"}


def _spec_of(fingerprint: DeviceFingerprint | None):
    """The DeviceSpec of the fingerprint's GPU; None without one, or for a GPU cutetune has
    no spec of."""
    if fingerprint is None:
        return None
    try:
        return device_spec_for(fingerprint.gpu_name)
    except ValueError:
        return None


def _latest(bench: pd.DataFrame) -> pd.DataFrame:
    """The latest row of each problem, token count and implementation (the frame is oldest
    first)."""
    return bench.drop_duplicates(["kernel_name", "static_key", "num_tokens", "implementation"],
                                 keep="last").reset_index(drop=True)


def knob_columns(winners: pd.DataFrame) -> list[str]:
    """The columns `_with_knobs` added."""
    return [c for c in winners.columns if c not in _WINNER_COLUMNS]


_WINNER_COLUMNS = {field.name for field in fields(Winner)} | {"problem", "gpu_name",
                                                              "current_source"}
