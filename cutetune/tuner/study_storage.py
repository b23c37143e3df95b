"""Optuna's storage for studies that outlive their process: each trial's owner and heartbeats
while it runs, trials a dead process left behind failed, and the queue of points put back in
order.

A trial a killed process left RUNNING is failed by the next tuner that opens its study, and by
every run at its end in every study of its buckets (those it found stored too), so no finished
run leaves one behind; a trial a live tuner is running is never failed:
- a trial owned by a process of this machine (trial_owner.py) is failed when that process no
  longer runs, at once, and never while it runs, whatever its heartbeat says;
- a trial of another machine, or one that recorded no owner (an older cutetune's), is failed
  when its heartbeat is older than the grace period (Optuna's rule): a live tuner beats every
  interval while a trial runs, and only the heartbeat crosses machines;
- a trial with neither owner nor point, asked for more than two heartbeats ago, died between
  its ask and its first record (an ask takes milliseconds).
Optuna's own check (fail_stale_trials) has only the heartbeat rule, so an immediate resume,
and a later run that skips the finished bucket, left a killed trial RUNNING for good.

Optuna beats a trial's heart only inside Study.optimize; cutetune's studies ask and tell, so
this module records the heartbeats itself (at the ask, then every interval while the trial
runs). It reaches into `study._storage`, `study._study_id`, `trial._trial_id` and the
storage's stale check, which Optuna's own heartbeat code uses too and which ask-and-tell has
no public handle for.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import create_engine, text

from cutetune.results_db.schema_version import SCHEMA_LOCK_KEY
from cutetune.results_db.session import SQLITE_BUSY_TIMEOUT_S
from cutetune.tuner.trial_owner import TrialOwner

OWNER_ATTR = "cutetune_owner"
# Where the storage keeps no heartbeats: how long an ask may take before a trial without owner
# or point counts as dead.
ASK_DEAD_AFTER_S = 60


def open_storage(url: str, heartbeat_interval_s: int = 10,
                 grace_period_s: int = 30) -> optuna.storages.RDBStorage:
    """Optuna's storage in the results database, with heartbeats: a trial whose heartbeat is
    older than `grace_period_s` belongs to a dead process and is failed by the next study."""
    # On SQLite, a file another tuner is writing is waited for as the results database waits.
    engine_kwargs = ({"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
                     if url.startswith("sqlite") else None)
    with warnings_silenced(), schema_lock(url):
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                          heartbeat_interval=heartbeat_interval_s,
                                          grace_period=grace_period_s)


@contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """On PostgreSQL, hold the lock under which tables are created (schema_version.py) while
    the block runs: Optuna creates its tables where they are missing, and tuners starting
    together on a new database would each try (the slower failing on a table that exists)."""
    if not url.startswith("postgresql"):
        yield
        return
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": SCHEMA_LOCK_KEY})
    finally:
        engine.dispose()


@contextmanager
def warnings_silenced() -> Iterator[None]:
    """Optuna calls heartbeats and its stale check experimental, and warns when heartbeats
    are used outside Study.optimize; all three are deliberate here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(heartbeat|fail_stale_trials).*")
        yield


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between heartbeats; None where the storage keeps none (in memory)."""
    return _interval(study._storage)


def _interval(storage: BaseStorage) -> int | None:
    return getattr(storage, "get_heartbeat_interval", lambda: None)()


def claim(study: optuna.Study, trial: optuna.Trial) -> None:
    """Record the trial's owner (this process) and its first heartbeat: right after the ask,
    before anything else, so that a trial this process dies running is failed at once by the
    next tuner on this machine."""
    trial.set_user_attr(OWNER_ATTR, TrialOwner.current().attr())
    beat(study, trial)


def beat(study: optuna.Study, trial: optuna.Trial) -> None:
    """Record the trial's heartbeat now (where the storage keeps heartbeats)."""
    if heartbeat_interval(study) is not None:
        study._storage.record_heartbeat(trial._trial_id)


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat every interval while the block runs, so that a trial
    whose process died is failed by `fail_abandoned_trials` in the next process."""
    interval = heartbeat_interval(study)
    if interval is None:
        yield
        return
    stop = threading.Event()

    def keep_beating() -> None:
        while not stop.wait(interval):
            beat(study, trial)

    thread = threading.Thread(target=keep_beating, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_abandoned_trials(study: optuna.Study) -> int:
    """Fail the trials of `study` a dead process left RUNNING (the module docstring says how
    a dead one is told from a live one); returns how many."""
    return _fail_abandoned(study._storage, study._study_id)


def fail_abandoned_in(storage: BaseStorage, study_names: Iterable[str]) -> int:
    """fail_abandoned_trials in each of the studies named (those not stored are skipped)."""
    failed = 0
    for name in study_names:
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            continue
        failed += _fail_abandoned(storage, study_id)
    return failed


def _fail_abandoned(storage: BaseStorage, study_id: int) -> int:
    if isinstance(storage, InMemoryStorage):  # only this process sees it
        return 0
    running = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return 0
    interval = _interval(storage)
    with warnings_silenced():
        stale = set(storage._get_stale_trial_ids(study_id)) if interval is not None else set()
    asked_before = datetime.now() - timedelta(
        seconds=2 * interval if interval is not None else ASK_DEAD_AFTER_S)
    failed = 0
    for trial in running:
        if not _abandoned(trial, stale, asked_before):
            continue
        try:
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
            failed += 1
        except UpdateFinishedTrialError:  # its owner told it, or another tuner failed it
            pass
    return failed


def _abandoned(trial: FrozenTrial, stale: set[int], asked_before: datetime) -> bool:
    owner = TrialOwner.from_attr(trial.user_attrs.get(OWNER_ATTR))
    if owner is not None and owner.on_this_machine():
        return not owner.alive()
    if trial._trial_id in stale:
        return True
    return owner is None and not trial.params and trial.datetime_start < asked_before


def requeue(study: optuna.Study, space: Any, configs: Sequence[Any],
            keep_waiting: bool = False) -> None:
    """Queue `configs` (points of `space`) in order. Trials a previous process queued and never
    asked are failed first (unless `keep_waiting`), so that the points are asked in the order
    an uninterrupted search asks them."""
    if not keep_waiting:
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    for config in configs:
        study.enqueue_trial(space.sampled_values(config))
