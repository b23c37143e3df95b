"""A child process that serves requests under a deadline, and is killed and started again when
it hangs, dies or reports that it can no longer serve.

The tuner runs everything that can hang or crash a process (a compile, a kernel launch) in such
a child: a kernel that spins forever, traps on the device or reads out of bounds takes the child
with it, never the process that owns the study and the database. A sticky CUDA error (illegal
address, trap, launch failure) leaves a process's CUDA context unusable, so a child that meets
one answers with `Fatal` and is replaced.

The child is started with the spawn method (a fork of a process that has touched CUDA cannot use
CUDA) and builds its handler from an import path, so a test can serve requests with a handler of
its own.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.spawn
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cutetune.build.interrupt import raise_if_interrupted

_SPAWN = multiprocessing.get_context("spawn")
_POLL_S = 0.5


class ProcessLost(Exception):
    """The child did not answer: `str()` is the reason, "hang: ...", "crash: <signal>" or
    "cuda: <error>"."""


class Fatal(Exception):
    """Raised by a handler for a request it answered in a way that ends its process (its CUDA
    context is lost); the parent reports `str()` as the reason and starts a new child."""


class SupervisedProcess:
    """One child process serving `factory(*args)`'s handler: `handler(request) -> reply`.

    `factory` is "module:attribute"; `environment` holds variables the child starts with (set
    before its interpreter imports anything: the spawn method imports the parent's main module,
    which may import CUDA libraries, before the factory runs); `hello` is what the handler's
    `hello()` returned when the child came up, kept for the parent to read.
    """

    def __init__(self, factory: str, args: tuple = (), environment: dict[str, str] | None = None,
                 startup_timeout_s: float = 300.0):
        self.factory = factory
        self.args = args
        self.environment = dict(environment or {})
        self.startup_timeout_s = startup_timeout_s
        self.hello: Any = None
        self.losses = 0  # children killed or found dead
        self._process = None
        self._connection = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> Any:
        """Start the child (if it is not running) and wait until it can serve."""
        if self.alive:
            return self.hello
        parent, child = _SPAWN.Pipe()
        self._process = _SPAWN.Process(target=_serve, daemon=True,
                                       args=(child, self.factory, self.args))
        with _started_with(self.environment):
            self._process.start()
        child.close()
        self._connection = parent
        try:
            self.hello = self._wait(self.startup_timeout_s, "starting up")
        except ProcessLost as lost:
            raise RuntimeError(f"the {self.factory} process did not start: {lost}") from None
        return self.hello

    def call(self, request: Any, timeout_s: float) -> Any:
        """Send one request and return the reply, starting the child first if it is not
        running. Raises ProcessLost (after killing the child) when no reply comes within
        `timeout_s`, when the child dies, or when its handler raised Fatal; RuntimeError
        with the child's traceback when its handler raised anything else. Waiting is a safe
        point for Ctrl-C (interrupt.py)."""
        self.start()
        self._connection.send(request)
        return self._wait(timeout_s, "serving")

    def stop(self) -> None:
        """Ask the child to leave; kill it if it does not within a few seconds."""
        if self.alive:
            try:
                self._connection.send(None)
            except OSError:
                pass
            self._process.join(5.0)
        self.kill()

    def kill(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
            self._process = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _wait(self, timeout_s: float, doing: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                self.losses += 1
                raise ProcessLost(f"hang: no answer in {timeout_s:.0f} s")
            if self._connection.poll(min(remaining, _POLL_S)):
                try:
                    kind, payload = self._connection.recv()
                except (EOFError, OSError):
                    raise ProcessLost(self._death()) from None
                if kind == "ok":
                    return payload
                self.kill()
                if kind == "fatal":
                    self.losses += 1
                    raise ProcessLost(payload)
                raise RuntimeError(f"the {self.factory} process failed while {doing}:\n{payload}")
            if not self._process.is_alive():
                raise ProcessLost(self._death())
            raise_if_interrupted()

    def _death(self) -> str:
        self._process.join()
        code = self._process.exitcode
        self.kill()
        self.losses += 1
        if code is not None and code < 0:
            return f"crash: {signal.Signals(-code).name}"
        return f"crash: exit status {code}"


def _exit_with(parent: int) -> None:
    """Leave when the parent is gone, even while the main thread is stuck (a kernel that never
    finishes): a child of a killed tuning run must not hold the GPU."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


_ENVIRONMENT = threading.Lock()


@contextmanager
def _started_with(environment: dict[str, str]) -> Iterator[None]:
    """This process's environment plus `environment`, while a child is started (it inherits
    the environment at its start); one child at a time, since the threads of a compile pool
    start theirs at once. The child does not import this process's main module, as the spawn
    method otherwise does: it needs nothing from it (its handler is named by module), and an
    engine's script without a main guard would run again in every child."""
    with _ENVIRONMENT:
        saved = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        preparation = multiprocessing.spawn.get_preparation_data
        multiprocessing.spawn.get_preparation_data = _without_main_module(preparation)
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = preparation
            for name, value in saved.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value


def _without_main_module(preparation: Callable[[str], dict]) -> Callable[[str], dict]:
    def prepare(name: str) -> dict:
        data = preparation(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    return prepare


def _serve(connection, factory: str, args: tuple) -> None:
    """The child's loop: build the handler, say hello, answer requests until told to stop."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with(os.getppid())
    module_name, attribute = factory.split(":")
    try:
        handler = getattr(importlib.import_module(module_name), attribute)(*args)
        connection.send(("ok", handler.hello()))
    except Exception:
        connection.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        try:
            connection.send(("ok", handler(request)))
        except Fatal as fatal:
            connection.send(("fatal", str(fatal)))
            return
        except Exception:
            connection.send(("error", traceback.format_exc()))
            return
