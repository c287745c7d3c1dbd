"""docs/tutorial.md, followed literally: every shell block run in order in one bash session,
every file block written, every output block checked, on a real redis-server, real Celery
workers and dockerd, and the fake Gemini server the page itself starts.

How the page's fenced blocks are read (`blocks`), in order:

- ` ```sh `: shell commands. Each line (with its `\\` continuations) is one command, run in the
  same bash session (so `cd`, variables and `$!` carry over), and must exit 0.
- ` ```LANG file=PATH `: a file the reader writes, whole; PATH is from the shell's current folder.
- ` ```LANG from=PATH `: an excerpt of a file a command wrote: its lines are there, in a row.
- ` ```text ` (no attribute): what the shell block before it printed. Each line is found in that
  output, in order, each on a line of its own; `…` stands for any text and a run of spaces for
  any run of spaces (tables and panels pad to the terminal's width).
- any other block is the prose's.

The environment is the one "Before you start" asks of the reader, and nothing more: the
checkout's `.venv/bin` first on `PATH`, `BATON_REDIS_URL` (a database of the session's
redis-server), git's name and email, a terminal `COLUMNS=100` wide; no other setting of Baton's
(and the repository mirror in the test's folder). Port 8765 must be free, as the page says.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.core.models import RunStatus
from orchestrator.core.store import RunStore
from tests.containers import sandboxes

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
FAKE_PORT = 8765
"""The fake model's port, as the page starts it."""
COMMAND_TIMEOUT_S = 120.0
"""The longest one command of the page may take (`baton watch` of a run with a sandbox)."""
STOP_TIMEOUT_S = 30.0
"""How long what the session left running may take to stop (a worker's warm shutdown)."""
DONE = "__tutorial_command_done__"
LOOP = 'while IFS= read -r -u {fd} line; do eval "$line"; printf "\\n{done} %s\\n" "$?"; done'
"""The session: commands from the pipe `fd`, stdin left alone (a command that reads it reads
nothing), each followed by a line saying it ended and its exit status."""
PROCESS_SETTINGS = ("BATON_", "GOOGLE_API_KEY", "GEMINI_API_KEY", "HELPDESK_TOKEN")


@dataclass(frozen=True)
class Block:
    kind: str
    """`sh`, `file`, `from` or `output`; `other` for the prose's own."""
    body: str
    path: str = ""


def blocks(text: str) -> list[Block]:
    """The page's fenced blocks, in order, by the conventions above."""
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        language = words[0] if words else ""
        attributes = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        if "file" in attributes:
            found.append(Block("file", match["body"], attributes["file"]))
        elif "from" in attributes:
            found.append(Block("from", match["body"], attributes["from"]))
        elif language == "sh":
            found.append(Block("sh", match["body"]))
        elif language == "text":
            found.append(Block("output", match["body"]))
        else:
            found.append(Block("other", match["body"]))
    return found


def commands(script: str) -> list[str]:
    """A shell block's commands: its lines, each joined with its `\\` continuations."""
    joined = re.sub(r"\\\n", "", script)
    return [line for line in joined.splitlines() if line.strip()]


def shown_in(shown: str, output: str) -> list[str]:
    """The lines of `shown` not found, in order, in `output` (`…` any text, spaces any run)."""
    lines = [" ".join(line.split()) for line in output.splitlines()]
    missing, at = [], 0
    for line in filter(str.strip, shown.splitlines()):
        parts = [re.escape(" ".join(part.split())) for part in line.split("…")]
        pattern = re.compile(".*".join(parts))
        hit = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


class Shell:
    """One bash session the page's commands run in, its output read line by line."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        read, self._commands = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", LOOP.format(fd=read, done=DONE)], cwd=cwd,
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(read,), start_new_session=True, text=True,
        )  # fmt: skip
        os.close(read)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, command: str) -> tuple[int, str]:
        """Run `command` in the session; its exit status and what it printed."""
        os.write(self._commands, (command + "\n").encode())
        printed: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=COMMAND_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(
                    f"`{command}` did not end within {COMMAND_TIMEOUT_S:.0f}s; it printed:\n"
                    + "".join(printed)
                ) from None
            if line is None:
                raise AssertionError(f"the shell ended during `{command}`:\n" + "".join(printed))
            if line.startswith(DONE):
                # The marker's printf starts with a newline: drop the one it added.
                text = "".join(printed)
                return int(line.split()[1]), text[:-1] if text.endswith("\n") else text
            printed.append(line)

    def close(self) -> None:
        """Stop the session and whatever it started and left running (its process group: a
        worker, its pool, the fake model), waiting until every one of them has gone."""
        os.close(self._commands)
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(self.proc):
                time.sleep(0.1)
        self.proc.wait()


def _group_alive(leader: subprocess.Popen[str]) -> bool:
    leader.poll()  # the shell itself, once it has ended, is no zombie of the group
    try:
        os.killpg(leader.pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the fake model binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def reader_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """The reader's terminal, as "Before you start" asks for it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROCESS_SETTINGS)}
    env |= {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)]),
        "BATON_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/11",
        "BATON_REPO_CACHE_DIR": str(tmp_path / "repo-cache"),
        "COLUMNS": "100",
        "GIT_AUTHOR_NAME": "Reader", "GIT_AUTHOR_EMAIL": "reader@example.com",
        "GIT_COMMITTER_NAME": "Reader", "GIT_COMMITTER_EMAIL": "reader@example.com",
    }  # fmt: skip
    return env


@pytest.fixture
def shell(tmp_path: Path, reader_env: dict[str, str]) -> Iterator[Shell]:
    assert port_free(FAKE_PORT), f"port {FAKE_PORT}, which the tutorial's fake model uses, is taken"
    (tmp_path / "reader").mkdir()
    session = Shell(tmp_path / "reader", reader_env)
    yield session
    session.close()


def test_the_tutorial_followed_literally_ends_in_a_done_run_with_its_tool_calls(
    shell: Shell, reader_env: dict[str, str]
) -> None:
    page = blocks(TUTORIAL.read_text())
    assert {"sh", "file", "from", "output"} <= {b.kind for b in page}, "the page's blocks moved"
    last_output: tuple[str, str] | None = None
    for block in page:
        if block.kind == "sh":
            printed = []
            for command in commands(block.body):
                status, text = shell.run(command)
                printed.append(text)
                assert status == 0, f"`{command}` exited {status}:\n{text}"
            last_output = (block.body, "\n".join(printed))
        elif block.kind == "output":
            assert last_output is not None, f"an output block before any command:\n{block.body}"
            script, printed_text = last_output
            assert shown_in(block.body, printed_text) == [], (
                f"the page says\n{script}\nprints\n{block.body}\nbut it printed\n{printed_text}"
            )
        elif block.kind in ("file", "from"):
            path = Path(shell.run("pwd")[1].strip()) / block.path
            if block.kind == "file":
                path.write_text(block.body)
            else:
                wrote = path.read_text()
                assert block.body in wrote, f"{block.path} does not hold:\n{block.body}\n{wrote}"

    # What the page claims of the run, read from the run's record, not through `baton`.
    run_id = shell.run("echo $RUN")[1].strip()
    folder = Path(shell.run("pwd")[1].strip())
    store = RunStore.from_url(reader_env["BATON_REDIS_URL"])
    try:
        run = store.get(run_id)
        assert run.status == RunStatus.DONE, run.reason
        assert run.pipeline == "helpdesk"
        scenario = json.loads((folder / "helpdesk/scenario.json").read_text())
        assert store.output(run_id, "label") == scenario["agents"]["label"][-1]["json"]
        audit = store.audit_log(run_id)
    finally:
        store.redis.close()
    results = [
        part["function_response"]
        for entry in audit
        if entry["kind"] == "tool_result"
        for part in json.loads(entry["data"])["content"]["parts"]
    ]
    called = [
        call["name"] for step in scenario["agents"]["label"] for call in step.get("calls", [])
    ]
    assert [r["name"] for r in results] == called  # every call the page scripts, each answered
    assert results[0]["response"]["error"].startswith("lookup_owner failed: LookupError: no team")
    assert results[1]["response"] == {"component": "checkout", "team": "payments"}
    assert (
        results[2]["response"]["exit_code"] == 0
        and "helpdesk/notes.py" in (results[2]["response"]["output"])
    )
    assert "on call this week" in results[3]["response"]["content"][0]["text"]
    assert sandboxes(run_id) == []  # the label stage's sandbox was removed when it ended
    token = shell.run("echo $HELPDESK_TOKEN")[1].strip()
    assert token and token not in json.dumps(audit)
    assert token not in (folder / "worker.log").read_text()
