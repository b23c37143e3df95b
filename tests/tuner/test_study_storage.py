"""Trials a dead process left RUNNING are failed, at once where the owner was on this machine,
by its heartbeat where it was elsewhere; a trial a live process runs is never failed; and a
whole-model run leaves no such trial in any study of its buckets, those it found stored too."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState

from cutetune.tuner.study_storage import (
    OWNER_ATTR,
    beat,
    claim,
    fail_abandoned_in,
    fail_abandoned_trials,
    open_storage,
    warnings_silenced,
)
from cutetune.tuner.trial_owner import TrialOwner, this_machine
from testkit.fault_run import LONG_GRACE_S, run


@pytest.fixture
def sleeper():
    """A live process of this machine, and its owner record."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.2)  # its /proc entry is there
        yield process
    finally:
        process.kill()
        process.wait()


def owner_of(process: subprocess.Popen) -> TrialOwner:
    owner = TrialOwner.current()
    with open(f"/proc/{process.pid}/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19])
    return replace(owner, pid=process.pid, started=started)


def dead_owner() -> TrialOwner:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(0.2)
    owner = owner_of(process)
    process.kill()
    process.wait()
    return owner


def running_trial(study: optuna.Study, owner: TrialOwner | None, point: bool = True) -> int:
    """A RUNNING trial of `owner` (None: one that recorded none), with its heartbeat now."""
    with warnings_silenced():
        trial = study.ask()
    if owner is not None:
        trial.set_user_attr(OWNER_ATTR, owner.attr())
    if point:
        trial.suggest_categorical("x", [1, 2])
    beat(study, trial)
    return trial.number


def states(study: optuna.Study) -> dict[int, TrialState]:
    return {t.number: t.state for t in study.get_trials(deepcopy=False)}


def study_in(tmp_path, grace_s: int = LONG_GRACE_S) -> optuna.Study:
    return optuna.create_study(
        study_name="s", storage=open_storage(f"sqlite:///{tmp_path / 'o.db'}", 1, grace_s))


def test_a_dead_owner_on_this_machine_is_failed_at_once_a_live_one_never(tmp_path, sleeper):
    study = study_in(tmp_path)
    dead = running_trial(study, dead_owner())
    live = running_trial(study, owner_of(sleeper))
    assert fail_abandoned_trials(study) == 1  # the heartbeats are fresh, the grace long
    assert states(study) == {dead: TrialState.FAIL, live: TrialState.RUNNING}


def test_a_live_owner_is_not_failed_when_its_heartbeat_is_stale(tmp_path, sleeper):
    study = study_in(tmp_path, grace_s=1)
    live = running_trial(study, owner_of(sleeper))
    time.sleep(2.5)
    assert fail_abandoned_trials(study) == 0
    assert states(study) == {live: TrialState.RUNNING}


def test_a_reused_pid_is_not_its_dead_owner(tmp_path, sleeper):
    """The pid lives, but it is another process: started at another time."""
    study = study_in(tmp_path)
    owner = owner_of(sleeper)
    reused = running_trial(study, replace(owner, started=owner.started - 1))
    assert fail_abandoned_trials(study) == 1
    assert states(study) == {reused: TrialState.FAIL}
    assert owner.alive() and not replace(owner, started=owner.started - 1).alive()


def test_another_machines_trial_is_failed_only_once_its_heartbeat_is_stale(tmp_path):
    study = study_in(tmp_path, grace_s=1)
    elsewhere = replace(TrialOwner.current(), machine="another host")
    remote = running_trial(study, elsewhere)
    assert fail_abandoned_trials(study) == 0
    time.sleep(2.5)
    assert fail_abandoned_trials(study) == 1
    assert states(study) == {remote: TrialState.FAIL}


def test_a_trial_that_died_asking_is_failed_after_two_heartbeats(tmp_path):
    study = study_in(tmp_path)
    with warnings_silenced():
        asked = study.ask()  # no owner, no point, no heartbeat: died between the ask and claim
    assert fail_abandoned_trials(study) == 0
    time.sleep(2.5)
    assert fail_abandoned_trials(study) == 1
    assert states(study) == {asked.number: TrialState.FAIL}


def test_claim_records_this_process(tmp_path):
    study = study_in(tmp_path)
    with warnings_silenced():
        trial = study.ask()
    claim(study, trial)
    (frozen,) = study.get_trials(deepcopy=False)
    owner = TrialOwner.from_attr(frozen.user_attrs[OWNER_ATTR])
    assert owner == TrialOwner.current() and owner.on_this_machine() and owner.alive()
    assert fail_abandoned_trials(study) == 0  # its own trial, in hand


def test_the_machine_tells_boots_and_pid_namespaces_apart():
    with open("/proc/sys/kernel/random/boot_id") as boot:
        assert boot.read().strip() in this_machine()
    assert this_machine().endswith("]")  # pid:[inode], the PID namespace
    assert TrialOwner.from_attr({"pid": 1}) is None


def test_a_run_fails_dead_trials_in_the_studies_of_buckets_it_found_stored(tmp_path, sleeper):
    """Every bucket is stored, so the run opens no study; its end still fails the dead
    process's trial and leaves the live process's."""
    url, cache = f"sqlite:///{tmp_path / 'run.db'}", tmp_path / "cache"
    run(url, cache, 2, [16], grace_s=LONG_GRACE_S)
    storage = open_storage(url, 1, LONG_GRACE_S)
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    dead = running_trial(study, dead_owner())
    live = running_trial(study, owner_of(sleeper))
    (again,) = run(url, cache, 2, [16], grace_s=LONG_GRACE_S)
    assert again.status == "stored"
    after = states(study)
    assert after[dead] == TrialState.FAIL and after[live] == TrialState.RUNNING
    assert fail_abandoned_in(storage, ["no such study"]) == 0
