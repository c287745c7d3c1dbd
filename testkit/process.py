"""Running one command on this host with a real time limit and a bounded amount of output kept:
what `testkit.workspace.LocalWorkspace` runs its commands with."""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from workers.tools.workspace import CommandResult

READ_CHUNK_BYTES = 65_536
EXIT_GRACE_S = 0.1
"""After the command exits, how long output may keep coming before stragglers are killed."""


class CappedOutput:
    """Keeps the first and the last bytes of a stream, never more than `max_bytes` in all."""

    def __init__(self, max_bytes: int) -> None:
        self.head_max_bytes = max_bytes // 4
        self.tail_max_bytes = max_bytes - self.head_max_bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.total_bytes = 0

    def write(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self.head_max_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.tail_max_bytes:
            del self.tail[: len(self.tail) - self.tail_max_bytes]

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (self.head + self.tail).decode(errors="replace")
        omitted = self.total_bytes - len(self.head) - len(self.tail)
        marker = f"\n[… {omitted} of {self.total_bytes} bytes of output omitted …]\n"
        return self.head.decode(errors="replace") + marker + self.tail.decode(errors="replace")


def run_capped(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
) -> CommandResult:
    """Run `argv` (no shell) in its own session; kill the whole group at the deadline.

    Output is read as it comes and at most `max_output_bytes` of it is kept. Whatever the
    command left running in its process group is killed when it ends, too.
    Raises `FileNotFoundError` or `PermissionError` when `argv[0]` cannot be executed.
    """
    output = CappedOutput(max_output_bytes)
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        finished = _pump(proc, output, time.monotonic() + timeout_s)
    finally:
        # Before the command is reaped its pid cannot be reused, so this hits only its group.
        _kill_group(proc.pid)
        proc.wait()
        proc.stdout.close()
    return CommandResult(
        exit_code=proc.returncode,
        output=output.text(),
        timed_out=not finished,
        truncated=output.truncated,
    )


def first_lines(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    limit: int,
    timeout_s: float,
) -> tuple[list[str], int, str]:
    """The first `limit` lines a command prints, its exit code and its stderr.

    The command is killed once it has printed `limit` lines, so a search over a huge tree costs
    no more than the lines wanted. Raises `TimeoutError` when `timeout_s` passes first.
    """
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        assert proc.stdout is not None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _kill_group(proc.pid)

        timer = threading.Timer(timeout_s, expire)
        timer.start()
        try:
            lines = [line.rstrip("\n") for line in itertools.islice(proc.stdout, limit)]
        finally:
            timer.cancel()
            _kill_group(proc.pid)
            proc.wait()
            proc.stdout.close()
        if expired.is_set():
            raise TimeoutError(f"{argv[0]} took over {timeout_s:g} s")
        errors.seek(0)
        return lines, proc.returncode, errors.read().decode(errors="replace")


def _pump(proc: subprocess.Popen[bytes], output: CappedOutput, deadline: float) -> bool:
    """Copy the command's output until it exits; False if the deadline came first.

    The command's exit is watched through a pidfd, which turns readable when it exits but does
    not reap it (its pid stays reserved): seen at once, though a child it left behind may still
    hold the pipe open.
    """
    assert proc.stdout is not None
    out_fd, exited, eof = proc.stdout.fileno(), False, False
    with selectors.DefaultSelector() as selector, _exit_watch(proc.pid) as exit_fd:
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(exit_fd, selectors.EVENT_READ)
        while not (exited and eof):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            events = selector.select(min(remaining, EXIT_GRACE_S) if exited else remaining)
            if not events:
                if exited:  # the command is gone; only a straggler can still hold the pipe
                    return True
                continue
            for key, _ in events:
                if key.fd == exit_fd:
                    exited = True
                    selector.unregister(exit_fd)
                    continue
                chunk = os.read(out_fd, READ_CHUNK_BYTES)
                if chunk:
                    output.write(chunk)
                else:
                    eof = True
                    selector.unregister(out_fd)
    return True


@contextmanager
def _exit_watch(pid: int) -> Iterator[int]:
    """A pidfd of process `pid`: readable once the process has exited."""
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group
