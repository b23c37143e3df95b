"""Supervised child processes: replies, and each way a child can fail to give one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cutetune.build.supervised import ProcessLost, SupervisedProcess
from testkit.child_process import child_env


@pytest.fixture
def toy():
    process = SupervisedProcess("testkit.toy_handler:Toy", ("hi",), {"TOY_VARIABLE": "set"})
    yield process
    process.stop()


@pytest.mark.parametrize(("request_", "reason"), [
    ("sleep", "hang: no answer in 1 s"),
    ("segfault", "crash: SIGSEGV"),
    ("exit", "crash: exit status 3"),
    ("fatal", "cuda: an illegal memory access was encountered"),
])
def test_a_lost_child_is_reported_and_replaced(toy, request_, reason):
    greeting, first = toy.start()
    assert greeting == "hi" and first != os.getpid()
    assert toy.call("ping", 30) == "PING"
    assert toy.call("environment", 30) == "set"
    started = time.monotonic()
    with pytest.raises(ProcessLost) as lost:
        toy.call(request_, 1)
    assert str(lost.value) == reason
    assert time.monotonic() - started < 10
    assert not toy.alive and toy.losses == 1
    assert toy.call("again", 30) == "AGAIN"  # a new child serves the next request
    assert toy.hello[1] != first


def test_a_bug_in_the_handler_surfaces_with_its_traceback(toy):
    with pytest.raises(RuntimeError, match="ValueError: a bug in the handler"):
        toy.call("bug", 30)


def test_a_child_that_cannot_start_says_why():
    process = SupervisedProcess("testkit.toy_handler:BrokenAtStart")
    with pytest.raises(RuntimeError, match="ImportError: no such library"):
        process.start()


def test_a_child_does_not_run_the_parents_main_module_again(tmp_path):
    """An engine's script without a main guard starts a child: the script runs once, not once
    more in the child (the spawn method's habit)."""
    script = tmp_path / "engine.py"
    script.write_text(
        "from pathlib import Path\n"
        "with Path(__file__).with_suffix('.runs').open('a') as runs:\n"
        "    runs.write('run\\n')\n"
        "from cutetune.build.supervised import SupervisedProcess\n"
        "child = SupervisedProcess('testkit.toy_handler:Toy', ('hi',))\n"
        "print(child.start()[0])\n"
        "child.stop()\n")
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=120, env=child_env())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "hi"
    assert script.with_suffix(".runs").read_text() == "run\n"
