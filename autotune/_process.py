"""Which process runs a piece of work, and whether that process is gone: what lets a later
session settle the trials a killed one left behind without touching a live one's."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

# The attribute (an Optuna trial's user attribute) that names the process running a trial.
OWNER_ATTR = "owner"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: int | None  # the process's start time (clock ticks since boot), where known

    def as_json(self) -> dict[str, str | int | None]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @classmethod
    def from_json(cls, data: object) -> Owner | None:
        """The owner a record names, or None if it names none (or something else)."""
        if not isinstance(data, dict):
            return None
        host, pid, started = data.get("host"), data.get("pid"), data.get("started")
        if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool):
            return None
        return cls(host, pid, started if isinstance(started, int) else None)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _started(pid: int) -> int | None:
    """Start time of a process (Linux /proc; None elsewhere or when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # the command name (field 2) may hold spaces: count fields after its ')'
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def this_process() -> Owner:
    return Owner(socket.gethostname(), os.getpid(), _started(os.getpid()))


def is_gone(owner: Owner) -> bool:
    """True only when `owner` surely no longer runs: on this host, with no process of its pid,
    or one started at another time (the pid was reused). A process on another host is never
    judged gone from here."""
    if owner.host != socket.gethostname():
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, under another user
    started = _started(owner.pid)
    return owner.started is not None and started is not None and started != owner.started
