"""Which process runs a trial, and whether it still lives: how a tuner tells a trial a killed
process left RUNNING from one a live tuner is running, on one machine, without waiting.

A trial records its owner when it is asked for: the machine and the process. On the same
machine a later tuner asks the OS whether that process still runs; on another it cannot, and
relies on the trial's heartbeat (study_storage.py).

The machine is the host name, the boot (Linux's boot id) and the PID namespace, because a pid
names one process only within one boot of one namespace: after a reboot, or in another
container of the same kernel (same host name and boot id with host networking), the same pid
is another process, so such an owner counts as another machine's. The process is its pid and
its start time (clock ticks since boot), because pids are reused: a live process under a dead
owner's pid has another start time.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrialOwner:
    machine: str
    pid: int
    started: int | None  # clock ticks since boot; None where /proc does not say

    @classmethod
    def current(cls) -> TrialOwner:
        pid = os.getpid()
        stat = _stat(pid)
        return cls(this_machine(), pid, stat[1] if stat else None)

    def attr(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_attr(cls, attr: Any) -> TrialOwner | None:
        """The owner a trial recorded; None where it recorded none (a trial of an older
        cutetune, or one whose process died between the ask and the record)."""
        if not isinstance(attr, dict) or set(attr) != {"machine", "pid", "started"}:
            return None
        return cls(attr["machine"], int(attr["pid"]), attr["started"])

    def on_this_machine(self) -> bool:
        return self.machine == this_machine()

    def alive(self) -> bool:
        """Whether the owner still runs (asked on its own machine). Where the OS cannot tell,
        the answer is yes: a live tuner's trial is never failed on a guess."""
        stat = _stat(self.pid)
        if stat is not None:
            state, started = stat
            return state not in ("Z", "X") and (self.started is None or started == self.started)
        try:  # no /proc entry to read (another OS, or hidden): does the pid exist at all?
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # it exists, as another user's process
            return True
        return True


@functools.cache
def this_machine() -> str:
    parts = [socket.gethostname()]
    for read in (lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                 lambda: os.readlink("/proc/self/ns/pid")):
        try:
            parts.append(read())
        except OSError:  # not Linux: the host name alone
            pass
    return " ".join(parts)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process from /proc; None where there
    is no entry to read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself:
    # the fields after the last ')' start with the state (3); the start time is field 22.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])
