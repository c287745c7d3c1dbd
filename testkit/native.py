"""A real C extension for the tests and the benchmarks: MarkupSafe 2.1.5 from PyPI, whose
speedups (`src/markupsafe/_speedups.c`) its setup compiles into the source tree, and the spec
that builds its environment and rebuilds the module in a sandbox.

    root = python_sdist(*PROJECT, cache)
    repo = as_git_repo(root, tmp / "repo")                    # testkit.projects
    changed = commit_speedups(repo, RIGHT, WRONG, "escape > wrongly")   # one line of C

`RIGHT` is the line of 2.1.5 that writes the `t` of `&gt;`; `WRONG` writes an `r` instead, a bug
only the compiled path has.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.core.git import COMMITTER
from sandbox.environment import BASE_PATH, VENV, EnvironmentSpec

PROJECT = ("MarkupSafe", "2.1.5")
SPEEDUPS = "src/markupsafe/_speedups.c"
RIGHT = "\t\t\t\t*outp++ = 'g'; \\\n\t\t\t\t*outp++ = 't'; \\\n"
WRONG = "\t\t\t\t*outp++ = 'g'; \\\n\t\t\t\t*outp++ = 'r'; \\\n"
SPEC = EnvironmentSpec(
    packages=("build-essential", "python3-dev"),
    setup=(
        f"python3 -m venv {VENV}",
        "python -m pip install setuptools wheel pytest",
        "python -m pip install --no-build-isolation -e .",
    ),
    build=("python setup.py build_ext --inplace",),
    build_inputs=("*.c", "*.h", "setup.py"),
    test="python -m pytest -q tests",
    env={"VIRTUAL_ENV": VENV, "PATH": f"{VENV}/bin:{BASE_PATH}"},
)
GIT_TIMEOUT_S = 60


def git(repo: Path, *args: str) -> str:
    """`git *args` in `repo` as Baton's committer; its output, stripped."""
    env = {"GIT_AUTHOR_NAME": COMMITTER["user.name"], "GIT_AUTHOR_EMAIL": COMMITTER["user.email"],
           "GIT_COMMITTER_NAME": COMMITTER["user.name"],
           "GIT_COMMITTER_EMAIL": COMMITTER["user.email"], "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, check=True,
        timeout=GIT_TIMEOUT_S,
    )  # fmt: skip
    return done.stdout.decode().strip()


def commit_speedups(repo: Path, old: str, new: str, message: str) -> str:
    """Replace `old` by `new` in `_speedups.c` and commit it; the new commit's sha."""
    path = repo / SPEEDUPS
    text = path.read_text()
    if text.count(old) != 1:
        raise ValueError(f"{SPEEDUPS} holds the line to replace {text.count(old)} times, not once")
    path.write_text(text.replace(old, new))
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")
