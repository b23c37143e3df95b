"""Ctrl-C during a tuning run, taken at safe points.

A KeyboardInterrupt raised at an arbitrary line could leave an Optuna trial RUNNING (inside its
ask) or end a trial between its outcome and its state. Inside `safe_points()`, the first SIGINT
only records the request; the run raises KeyboardInterrupt at the next safe point: while it
waits for a worker or a compile (the trial in hand is then failed), or between two trials. A
second SIGINT interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_requested = threading.Event()


@contextmanager
def safe_points() -> Iterator[None]:
    """Defer Ctrl-C to the safe points while the block runs (in the main thread only, where
    Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        try:
            yield
        finally:
            _requested.clear()  # a stop a worker thread requested (request_stop)
        return

    def request(signum, frame) -> None:
        if _requested.is_set():
            raise KeyboardInterrupt
        _requested.set()

    previous = signal.signal(signal.SIGINT, request)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested.clear()


def request_stop() -> None:
    """Stop the run at its next safe points, as a first Ctrl-C does (a worker thread that
    failed stops the others)."""
    _requested.set()


def raise_if_interrupted() -> None:
    """A safe point: raise KeyboardInterrupt here if Ctrl-C was pressed."""
    if _requested.is_set():
        raise KeyboardInterrupt
