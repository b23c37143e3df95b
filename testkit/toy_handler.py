"""A handler for supervised processes that misbehaves on request (tests of the supervision)."""

from __future__ import annotations

import os
import signal
import time

from cutetune.build.supervised import Fatal


class Toy:
    def __init__(self, greeting: str = "hello"):
        self.greeting = greeting

    def hello(self) -> tuple[str, int]:
        return self.greeting, os.getpid()

    def __call__(self, request: str):
        if request == "sleep":
            time.sleep(3600)
        if request == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if request == "exit":
            os._exit(3)
        if request == "fatal":
            raise Fatal("cuda: an illegal memory access was encountered")
        if request == "bug":
            raise ValueError("a bug in the handler")
        if request == "environment":
            return os.environ.get("TOY_VARIABLE")
        return request.upper()


class BrokenAtStart:
    def __init__(self):
        raise ImportError("no such library")
