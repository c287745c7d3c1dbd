"""Who owns a sandbox, when the reaper may consider that owner gone, and what its name says."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from sandbox import labels

HOST = f"{socket.gethostname()}/{os.stat('/proc/self/ns/pid').st_ino}"
"""This host and this process's pid namespace, as an owner names them."""


def test_the_owner_names_this_host_its_pid_namespace_this_pid_and_its_start_time() -> None:
    host, pid, started = labels.owner().split(":")
    with open(f"/proc/{os.getpid()}/stat") as stat:
        expected_start = stat.read().rsplit(")", 1)[1].split()[19]
    assert (host, int(pid), started) == (HOST, os.getpid(), expected_start)


def test_a_live_owner_is_not_gone() -> None:
    assert labels.owner_is_gone(labels.owner()) is False


def test_a_reused_pid_with_another_start_time_is_gone() -> None:
    host, pid, started = labels.owner().split(":")
    assert labels.owner_is_gone(f"{host}:{pid}:{int(started) + 1}") is True


def test_an_exited_process_is_gone_even_before_it_is_waited_for() -> None:
    child = subprocess.Popen(["sleep", "30"])
    value = f"{HOST}:{child.pid}:{labels.process_start_time(child.pid)}"
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
    assert labels.owner_is_gone("some-other-host/4026531836:1:1") is False


def test_an_owner_in_another_pid_namespace_of_this_host_is_never_gone_from_here() -> None:
    """The containers of one pod share its host name, not their pids: a worker's sandboxes
    are not its builder's to judge (pid 999999 exists in no namespace here)."""
    host, _, started = labels.owner().split(":")
    name = host.split("/")[0]
    assert labels.owner_is_gone(f"{name}/1:999999:{started}") is False
    assert labels.owner_is_gone(f"{name}:999999:{started}") is False  # written before the
    assert labels.owner_is_gone(f"{HOST}:999999:{started}") is True  # namespace was named


def test_a_malformed_owner_is_left_alone() -> None:
    assert labels.owner_is_gone("nonsense") is False


@pytest.mark.parametrize(
    ("given", "matches", "misses"),
    [
        ({"baton.run": "r1"}, ["r1.fix.1", "r1.search.3"], ["r10.fix.1", "r2.fix.1", "r1-2.fix.1"]),
        ({"baton.run": "r1", "baton.stage": "fix"}, ["r1.fix.1", "r1.fix.12"],
         ["r1.fixer.1", "r1.search.1"]),
        ({"baton.run": "r1", "baton.stage": "fix", "baton.attempt": "1"}, ["r1.fix.1"],
         ["r1.fix.12", "r1.fix.2", "r1.fix.b1.1"]),
        # A branch's sandboxes: its own, not a sibling's, nor its stage's of another attempt.
        ({"baton.run": "r1", "baton.stage": "fix"}, ["r1.fix.b2.1"], ["r1.fixer.b2.1"]),
        ({"baton.run": "r1", "baton.stage": "fix", "baton.branch": "b2"},
         ["r1.fix.b2.1", "r1.fix.b2.3"], ["r1.fix.b1.1", "r1.fix.b21.1", "r1.fix.2"]),
        ({"baton.run": "r1", "baton.stage": "fix", "baton.branch": "b2", "baton.attempt": "1"},
         ["r1.fix.b2.1"], ["r1.fix.b2.12", "r1.fix.b3.1", "r1.fix.1"]),
    ],
)  # fmt: skip
def test_a_sandboxs_name_spells_its_execution_and_the_pattern_finds_exactly_those(
    given: dict[str, str], matches: list[str], misses: list[str]
) -> None:
    pattern = labels.name_pattern(given)
    assert pattern is not None

    def named(execution: str) -> str:  # as Docker lists a name: with a leading slash
        run, stage, *branch, attempt = execution.split(".") if "." in execution else (
            execution, "", "")  # fmt: skip
        own = {"baton.run": run, "baton.stage": stage, "baton.branch": "".join(branch),
               "baton.attempt": attempt}  # fmt: skip
        return "/" + labels.container_name({k: v for k, v in own.items() if v})

    assert all(re.search(pattern, named(m)) for m in matches)
    assert not any(re.search(pattern, named(m)) for m in misses)


def test_names_hold_only_what_docker_allows_and_say_nothing_they_cannot() -> None:
    name = labels.container_name({"baton.run": "r/1 x", "baton.stage": "fix"})
    assert re.fullmatch(r"baton-sbx-r_1_x\.fix-[0-9a-f]{12}", name)
    assert re.fullmatch(r"baton-sbx-[0-9a-f]{12}", labels.container_name({}))
    assert labels.name_pattern({"baton.stage": "fix"}) is None  # a stage of any run
    assert labels.name_pattern({"baton.run": "r1", "team": "x"}) is None
