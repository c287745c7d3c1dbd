"""How a command's end is told (`DockerSandbox._follow`), on the answers dockerd gives: an exec
that Docker has not started yet reads "not running" with no exit code, and must not be taken
for one that ended (a busy host sees it; the command's output then came with exit code -9)."""

from __future__ import annotations

from sandbox.docker import DockerSandbox


class Answers(DockerSandbox):
    """A sandbox whose dockerd answers each exec inspection from a script."""

    def __init__(self, answers: list[tuple[bool, int | None]]) -> None:  # no container
        self.id = "c" * 64
        self.answers = answers
        self.killed: list[str] = []

    def _inspect(self, exec_id: str) -> tuple[bool, int | None]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def _kill_group(self, token: str) -> None:
        self.killed.append(token)


class Output:
    """An exec's output stream that closes after a number of reads."""

    def __init__(self, open_for: int) -> None:
        self.reads = open_for

    def read_until(self, deadline: float) -> bool:
        self.reads -= 1
        return self.reads > 0


def test_an_exec_not_started_yet_is_waited_for_until_it_ends_with_its_code() -> None:
    box = Answers([(False, None), (False, None), (True, None), (False, 0)])

    ended = box._follow("exec", "token", Output(open_for=3), deadline=float("inf"))  # type: ignore[arg-type]

    assert ended == (0, False)
    assert box.answers == [(False, 0)] and box.killed == []


def test_control_an_exec_that_ended_gives_its_exit_code_at_once() -> None:
    box = Answers([(False, 3)])

    ended = box._follow("exec", "token", Output(open_for=1), deadline=float("inf"))  # type: ignore[arg-type]

    assert ended == (3, False)
