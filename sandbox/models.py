"""What a command run in a sandbox produced."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Status = Literal["ok", "failed", "timeout", "oom"]


class ExecResult(BaseModel):
    """The outcome of one command. A timeout, an out-of-memory kill and a plain non-zero exit
    are told apart: `status` names which one happened."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None
    """The command's exit status (128 + n when signal n ended it); None when it was killed at
    its timeout."""
    output: str
    """stdout and stderr interleaved in the order the command wrote them (they share one pipe),
    decoded as UTF-8 (undecodable bytes replaced), at most `max_output_bytes` of it."""
    timed_out: bool
    """The command outlived its timeout and its whole process group was killed."""
    oom_killed: bool
    """The kernel killed a process of the sandbox for memory while the command ran."""
    truncated: bool
    """More output came than was kept; the rest was read and dropped."""
    duration_s: float
    """Wall-clock time from starting the command to having its result."""

    @property
    def status(self) -> Status:
        """`oom` or `timeout` when the sandbox ended the command, else `ok` or `failed` by its
        exit code."""
        if self.oom_killed:
            return "oom"
        if self.timed_out:
            return "timeout"
        return "ok" if self.exit_code == 0 else "failed"
