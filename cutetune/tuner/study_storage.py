"""Optuna's storage for studies that outlive their process: heartbeats while a trial runs,
trials a dead process left behind failed, and the queue of points put back in order.

Optuna beats a trial's heart only inside Study.optimize; cutetune's studies ask and tell, so
this module records the heartbeats itself (at the ask, then every interval while the trial
runs). It reaches into `study._storage` and `trial._trial_id`, which Optuna's own heartbeat
code uses too and which ask-and-tell has no public handle for.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState


def open_storage(url: str, heartbeat_interval_s: int = 10,
                 grace_period_s: int = 30) -> optuna.storages.RDBStorage:
    """Optuna's storage in the results database, with heartbeats: a trial whose heartbeat is
    older than `grace_period_s` belongs to a dead process and is failed by the next study."""
    with warnings_silenced():
        return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat_interval_s,
                                          grace_period=grace_period_s)


@contextmanager
def warnings_silenced() -> Iterator[None]:
    """Optuna calls heartbeats and fail_stale_trials experimental, and warns when heartbeats
    are used outside Study.optimize; all three are deliberate here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(heartbeat|fail_stale_trials).*")
        yield


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between heartbeats; None where the storage keeps none (in memory)."""
    return getattr(study._storage, "get_heartbeat_interval", lambda: None)()


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


def fail_abandoned_trials(study: optuna.Study) -> None:
    """Fail the trials a dead process left RUNNING: those whose heartbeat stopped (Optuna's
    check), and those it died asking for, before the trial had its point or a heartbeat."""
    storage = study._storage
    interval = heartbeat_interval(study)
    if interval is None:  # no heartbeats: only this process uses the storage
        return
    with warnings_silenced():
        fail_stale_trials(study)
    # An ask takes milliseconds: a trial still without its point after two heartbeats is dead.
    cutoff = datetime.now() - timedelta(seconds=2 * interval)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not trial.params and trial.datetime_start < cutoff:
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)


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
