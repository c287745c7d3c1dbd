"""The labels every sandbox container carries, who owns it, and its name. The reaper reads only
the labels.

    baton.sandbox = 1                          marks Baton's sandboxes; nothing else is touched
    baton.expires = <epoch seconds>            creation time + ttl_s
    baton.owner   = <host>:<pid>:<start time>  the process that created it

A pid alone is not an identity (pids are reused), so the owner also names the process's start
time, in clock ticks since boot, as Linux reports it in /proc/<pid>/stat. Nor is a host name:
the containers of one Kubernetes pod share the pod's (a worker and its environment builder),
each with pids of its own. So <host> is the host name and the process's pid namespace
(`<hostname>/<namespace inode>`): a reaper judges only the owners whose pids it can see.

An execution's sandbox also says whose it is: its labels `baton.run`, `baton.stage`, for a
branch of a fan-out stage `baton.branch`, and `baton.attempt` when it was started for it, and
always its name, `baton-sbx-<run>.<stage>[.<branch>].<attempt>-<random>`. Labels are fixed
when a container is created, so one a warm pool started before anyone asked for it gets its
name when it is taken (a rename); `docker ps --filter name=<run>` finds a run's sandboxes
either way, as `name_pattern` does.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from functools import cache

SANDBOX = "baton.sandbox"
EXPIRES = "baton.expires"
OWNER = "baton.owner"

SANDBOX_FILTER = f"{SANDBOX}=1"
"""Docker label filter that selects every sandbox container."""

NAME_PREFIX = "baton-sbx-"
NAMED_BY = ("baton.run", "baton.stage", "baton.branch", "baton.attempt")
"""The labels a sandbox's name spells, in this order."""
SKIPPABLE = frozenset({"baton.branch"})
"""Of `NAMED_BY`, those a name leaves out when a sandbox does not have them (a stage that does
not fan out has no branch); the others end the name where the first one is missing."""


def container_name(labels: Mapping[str, str]) -> str:
    """A new sandbox's name: `NAME_PREFIX`, the values of the `NAMED_BY` labels it has (from
    the first, joined by dots) and a random part; only the random part when it has none."""
    named = _named(labels)
    return f"{NAME_PREFIX}{'.'.join(named) + '-' if named else ''}{uuid.uuid4().hex[:12]}"


def name_pattern(labels: Mapping[str, str]) -> str | None:
    """The Docker `name` filter matching every sandbox named for `labels`; None when `labels`
    hold a label the name does not spell, or skip one it does (a stage without its run)."""
    named = _named(labels)
    if not named or len(named) != len(labels):
        return None
    whole = NAMED_BY[-1] in labels
    return f"^/{re.escape(NAME_PREFIX + '.'.join(named))}{'-' if whole else '[.]'}"


def _named(labels: Mapping[str, str]) -> list[str]:
    named = []
    for key in NAMED_BY:
        if key not in labels and key in SKIPPABLE:
            continue
        if key not in labels:
            break
        named.append(re.sub(r"[^A-Za-z0-9_-]", "_", labels[key]))
    return named


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
    return owner_of(pid)


def owner_of(pid: int) -> str:
    """The `baton.owner` value of process `pid` as this process sees it (the sandbox gate
    stamps it for the peer of the socket that created a container)."""
    return f"{_host()}:{pid}:{process_start_time(pid) or '?'}"


def _host(hostname: str | None = None) -> str:
    """This host's name and the pid namespace this process sees (its inode; `?` without
    /proc), as an owner names them."""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "?"
    return f"{hostname or socket.gethostname()}/{namespace}"


def owner() -> str:
    """The `baton.owner` value of this process (recomputed after a fork)."""
    return _owner(os.getpid())


def owner_is_gone(value: str, *, hostname: str | None = None) -> bool:
    """True when `value` names a process of this host and pid namespace that no longer exists:
    its pid is gone, or now belongs to a process that started at another time. The owners of
    another host or pid namespace are never gone from here: their sandboxes expire instead."""
    try:
        host, pid_text, started = value.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != _host(hostname) or host.endswith("/?"):
        return False
    now = process_start_time(pid)
    return now is None or (started != "?" and now != "?" and now != started)
