"""The labels every sandbox container carries, and who owns it. The reaper reads only these.

    baton.sandbox = 1                          marks Baton's sandboxes; nothing else is touched
    baton.expires = <epoch seconds>            creation time + ttl_s
    baton.owner   = <host>:<pid>:<start time>  the process that created it

A pid alone is not an identity (pids are reused), so the owner also names the process's start
time, in clock ticks since boot, as Linux reports it in /proc/<pid>/stat.
"""

from __future__ import annotations

import os
import socket
from functools import cache

SANDBOX = "baton.sandbox"
EXPIRES = "baton.expires"
OWNER = "baton.owner"

SANDBOX_FILTER = f"{SANDBOX}=1"
"""Docker label filter that selects every sandbox container."""


def process_start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None if there is no such process
    or it is a zombie (dead, not yet waited for). `"?"` where /proc is not available (then only
    the pid is compared)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else _pid_exists(pid)
    except OSError:
        return "?"
    # The command name, in parentheses, may hold spaces: fields 3 (state) to 22 (starttime)
    # follow the last parenthesis.
    after_name = fields.rsplit(")", 1)[1].split()
    return None if after_name[0] in ("Z", "X") else after_name[19]


def _pid_exists(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"


@cache
def _owner(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:{process_start_time(pid) or '?'}"


def owner() -> str:
    """The `baton.owner` value of this process (recomputed after a fork)."""
    return _owner(os.getpid())


def owner_is_gone(value: str, *, hostname: str | None = None) -> bool:
    """True when `value` names a process on this host that no longer exists: its pid is gone,
    or now belongs to a process that started at another time. Another host's owners are never
    gone from here: their sandboxes expire instead."""
    try:
        host, pid_text, started = value.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != (hostname or socket.gethostname()):
        return False
    now = process_start_time(pid)
    return now is None or (started != "?" and now != "?" and now != started)
