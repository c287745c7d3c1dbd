"""Commands in a sandbox: exit codes, output, timeouts, hangs, floods, memory, fork bombs."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

from sandbox import DockerSandbox
from tests.sandbox.conftest import ON_EACH_RUNTIME, on_each_runtime

FORK_BOMB = (
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
)
LIST_PROCESSES = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        line = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ')\n"
    "    except OSError:\n"
    "        continue\n"
    "    if pid != str(os.getpid()):\n"
    "        print(line.decode().strip())\n"
)


def processes(box: DockerSandbox) -> list[str]:
    """Command lines of the sandbox's other processes, from /proc (the image has no `ps`)."""
    result = box.exec(["python3", "-c", LIST_PROCESSES])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_a_failing_command_reports_its_exit_code_and_interleaved_output(box: DockerSandbox) -> None:
    script = "echo one; echo two >&2; sleep 0.1; echo three; exit 3"
    result = box.exec(["sh", "-c", script])
    assert (result.exit_code, result.status) == (3, "failed")
    assert result.output == "one\ntwo\nthree\n"
    assert not (result.timed_out or result.oom_killed or result.truncated)


def test_a_successful_command_is_ok_and_runs_in_the_workspace(box: DockerSandbox) -> None:
    result = box.exec(["pwd"])
    assert (result.exit_code, result.status, result.output) == (0, "ok", "/workspace\n")
    assert box.exec(["pwd"], workdir="/tmp").output == "/tmp\n"


def test_a_missing_program_fails_with_127(box: DockerSandbox) -> None:
    result = box.exec(["no-such-program", "x"])
    assert (result.exit_code, result.status) == (127, "failed")
    assert "no-such-program: not found" in result.output


@ON_EACH_RUNTIME
def test_a_sleep_is_killed_at_its_timeout_and_leaves_no_process(box: DockerSandbox) -> None:
    started = time.monotonic()
    result = box.exec(["sh", "-c", "sleep 1000 & sleep 1001"], timeout_s=2)
    assert 2 <= time.monotonic() - started < 5
    assert (result.timed_out, result.status, result.exit_code) == (True, "timeout", None)
    assert [p for p in processes(box) if "sleep 100" in p] == []


@ON_EACH_RUNTIME
def test_the_configured_timeout_applies_when_the_call_gives_none(
    start_sandbox: Callable[..., DockerSandbox],
) -> None:
    box = start_sandbox(exec_timeout_s=1)
    result = box.exec(["sleep", "30"])
    assert result.status == "timeout"
    assert result.duration_s < 4


@ON_EACH_RUNTIME
def test_a_background_child_holding_stdout_does_not_hang_the_command(box: DockerSandbox) -> None:
    started = time.monotonic()
    result = box.exec(["sh", "-c", "sleep 300 & echo started"], timeout_s=60)
    assert time.monotonic() - started < 3
    assert (result.exit_code, result.output, result.timed_out) == (0, "started\n", False)
    assert [p for p in processes(box) if "sleep 300" in p] == []


def test_a_background_child_that_let_go_of_stdout_keeps_running(box: DockerSandbox) -> None:
    result = box.exec(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo started"])
    assert (result.exit_code, result.output) == (0, "started\n")
    assert "sleep 300" in processes(box)


@ON_EACH_RUNTIME
def test_an_output_flood_is_capped_and_memory_stays_bounded(box: DockerSandbox) -> None:
    flood = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)\n"
    tracemalloc.start()
    try:
        result = box.exec(["python3", "-c", flood], max_output_bytes=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result.exit_code, result.truncated) == (0, True)
    assert result.output == "x" * 100_000
    assert peak < 5_000_000


def test_output_is_capped_by_the_configured_limit_by_default(
    start_sandbox: Callable[..., DockerSandbox],
) -> None:
    box = start_sandbox(max_output_bytes=10)
    result = box.exec(["echo", "0123456789abcdef"])
    assert (result.output, result.truncated) == ("0123456789", True)


@on_each_runtime(
    runsc_fails="runsc 20221219: the host's memory cgroup OOM-kills the whole gVisor sandbox, "
    "or gVisor kills the command itself (exit 128) where the host's oom_kill count shows nothing"
)
def test_a_memory_bomb_is_reported_as_oom(start_sandbox: Callable[..., DockerSandbox]) -> None:
    box = start_sandbox(memory_mb=128)
    result = box.exec(["python3", "-c", "x = b'x' * (512 * 1024 * 1024)"])
    assert (result.oom_killed, result.status, result.exit_code) == (True, "oom", 137)
    assert box.exec(["python3", "-c", "x = b'x' * (16 * 1024 * 1024)"]).status == "ok"


@ON_EACH_RUNTIME
def test_a_plain_sigkill_is_not_mistaken_for_oom(box: DockerSandbox) -> None:
    result = box.exec(["sh", "-c", "kill -9 $$"])
    assert (result.exit_code, result.oom_killed, result.status) == (137, False, "failed")


@on_each_runtime(
    runsc_fails="runsc 20221219 (ptrace): at the pids limit the sentry cannot start a host "
    "process and panics, ending the sandbox"
)
def test_a_fork_bomb_is_contained_by_the_pids_limit(
    start_sandbox: Callable[..., DockerSandbox],
) -> None:
    box = start_sandbox(pids_limit=64)
    started = time.monotonic()
    result = box.exec(["python3", "-c", FORK_BOMB], timeout_s=3)
    assert time.monotonic() - started < 15
    assert result.status in ("timeout", "failed")
    assert box.exec(["true"]).exit_code == 0
    assert [p for p in processes(box) if "python3 -c" in p] == []


def test_stdin_bytes_reach_the_command_and_are_closed(box: DockerSandbox) -> None:
    data = b"\x00\xffbinary" * 500_000
    result = box.exec(["sh", "-c", "wc -c"], stdin=data)
    assert (result.exit_code, result.output.strip()) == (0, str(len(data)))


def test_a_command_that_ignores_stdin_does_not_block_on_it(box: DockerSandbox) -> None:
    result = box.exec(["true"], stdin=b"x" * 10_000_000, timeout_s=30)
    assert (result.exit_code, result.timed_out) == (0, False)
