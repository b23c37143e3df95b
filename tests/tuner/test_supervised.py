"""Supervised child processes: replies, and each way a child can fail to give one."""

from __future__ import annotations

import os
import time

import pytest

from cutetune.tuner.supervised import ProcessLost, SupervisedProcess


@pytest.fixture
def toy():
    process = SupervisedProcess("toy_handler:Toy", ("hi",), {"TOY_VARIABLE": "set"})
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
    process = SupervisedProcess("toy_handler:BrokenAtStart")
    with pytest.raises(RuntimeError, match="ImportError: no such library"):
        process.start()
