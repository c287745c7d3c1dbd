"""Who owns a sandbox, and when the reaper may consider that owner gone."""

from __future__ import annotations

import os
import socket
import subprocess

from sandbox import labels


def test_the_owner_names_this_host_this_pid_and_its_start_time() -> None:
    host, pid, started = labels.owner().split(":")
    with open(f"/proc/{os.getpid()}/stat") as stat:
        expected_start = stat.read().rsplit(")", 1)[1].split()[19]
    assert (host, int(pid), started) == (socket.gethostname(), os.getpid(), expected_start)


def test_a_live_owner_is_not_gone() -> None:
    assert labels.owner_is_gone(labels.owner()) is False


def test_a_reused_pid_with_another_start_time_is_gone() -> None:
    host, pid, started = labels.owner().split(":")
    assert labels.owner_is_gone(f"{host}:{pid}:{int(started) + 1}") is True


def test_an_exited_process_is_gone_even_before_it_is_waited_for() -> None:
    child = subprocess.Popen(["sleep", "30"])
    value = f"{socket.gethostname()}:{child.pid}:{labels.process_start_time(child.pid)}"
    assert labels.owner_is_gone(value) is False
    child.kill()
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie
        assert labels.owner_is_gone(value) is True
    finally:
        child.wait()
    assert labels.owner_is_gone(value) is True


def test_another_hosts_owner_is_never_gone_from_here() -> None:
    assert labels.owner_is_gone("some-other-host:1:1") is False


def test_a_malformed_owner_is_left_alone() -> None:
    assert labels.owner_is_gone("nonsense") is False
