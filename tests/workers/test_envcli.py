"""`baton env detect`, and how every `baton env` failure reads: through the `baton` command
itself (click's runner), with a git repository and no service."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from orchestrator.control import messages
from orchestrator.control.cli import main
from sandbox.build import EnvironmentBuildError
from sandbox.errors import SandboxUnavailableError
from tests.repos import Upstream
from workers import envcli

SETUP_PY = (
    "from setuptools import Extension, setup\n"
    'setup(ext_modules=[Extension("fast._speed", ["fast/_speed.c"])])\n'
)
PROJECT = {
    "setup.py": SETUP_PY,
    "fast/__init__.py": "",
    "fast/_speed.c": "#include <Python.h>\n#include <yaml.h>\n",
    "requirements/tests.txt": "pytest\n",
    "requirements/dev.txt": "tox\npre-commit\n",
}


def baton(tmp_path: Path, *args: str) -> Result:
    settings = {"BATON_REPO_CACHE_DIR": str(tmp_path / "cache")}
    return CliRunner().invoke(main, ["env", *args], env=settings)


def test_detect_prints_a_spec_file_with_its_reasons(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    commit = upstream.commit(PROJECT)

    done = baton(tmp_path, "detect", str(upstream.bare))

    assert done.exit_code == 0, done.output
    comments = [line for line in done.stdout.splitlines() if line.startswith("#")]
    assert comments[0].startswith(f"# baton env detect {upstream.bare} --ref HEAD: {commit[:12]}")
    assert comments[1] == (
        "# test deps: requirements/tests.txt (test set; requirements/dev.txt left out)"
    )
    spec = tomllib.loads(done.stdout)
    assert spec["packages"] == ["build-essential", "pkg-config", "python3-dev", "libyaml-dev"]
    assert spec["build"] == ["python setup.py build_ext --inplace"]
    assert spec["build_inputs"] == ["*.c", "*.h", "setup.py"]
    assert "python -m pip install -r requirements/tests.txt" in spec["setup"]


def test_detect_shows_the_repositorys_own_spec(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({**PROJECT, ".baton/environment.toml": 'setup = ["make"]\ntest = "make t"\n'})

    done = baton(tmp_path, "detect", str(upstream.bare), "--json")

    shown = json.loads(done.stdout)
    assert (shown["spec"]["setup"], shown["spec"]["source"]) == (["make"], "file")
    assert shown["reasons"] == ["read from .baton/environment.toml"]


def test_an_unknown_ref_is_one_line_and_exit_2(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit(PROJECT)

    done = baton(tmp_path, "detect", str(upstream.bare), "--ref", "no-such-branch")

    assert done.exit_code == 2
    assert done.stderr.startswith("error: 'no-such-branch' names no commit")
    assert "Traceback" not in done.output


def test_a_bad_spec_file_is_one_line_and_exit_2(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit(PROJECT)
    bad = tmp_path / "env.toml"
    bad.write_text("setup = [\n")

    done = baton(tmp_path, "build", str(upstream.bare), "--env", str(bad))

    assert done.exit_code == 2
    assert done.stderr.startswith(f"error: {bad}: not a readable TOML file")
    assert len(done.stderr.strip().splitlines()) == 1


class FailingEnvironments:
    """Stands in for `Environments` (whose real builds need Docker): its prepare raises."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def prepare(self, *args: Any, **kwargs: Any) -> None:
        raise self.error


def test_a_failed_build_says_the_command_its_tail_and_where_the_log_is(
    make_upstream: Callable[[], Upstream], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = make_upstream()
    commit = upstream.commit(PROJECT)
    error = EnvironmentBuildError(
        "setup command 'python setup.py build_ext' exited with 1:\nfast/_speed.c:2: yaml.h: No "
        "such file\nerror: command 'gcc' failed",
        log="$ python3 -m venv /opt/baton/venv\n...\nthe whole of it\n",
    )
    monkeypatch.setattr(envcli, "_environments", lambda settings: FailingEnvironments(error))

    done = baton(tmp_path, "build", str(upstream.bare))

    lines = done.stderr.splitlines()
    assert done.exit_code == 1
    assert lines[0] == "error: setup command 'python setup.py build_ext' exited with 1"
    assert lines[1:3] == ["fast/_speed.c:2: yaml.h: No such file", "error: command 'gcc' failed"]
    log = Path(lines[3].removeprefix("the whole log: "))
    assert log.parent == tmp_path / "cache" / "env-logs" and commit[:12] in log.name
    assert log.read_text() == error.log


def test_an_unreachable_docker_is_exit_3(
    make_upstream: Callable[[], Upstream], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = make_upstream()
    upstream.commit(PROJECT)
    error = SandboxUnavailableError("connecting to the Docker daemon: no socket")
    monkeypatch.setattr(envcli, "_environments", lambda settings: FailingEnvironments(error))

    done = baton(tmp_path, "build", str(upstream.bare))

    assert done.exit_code == 3
    assert done.stderr.startswith("error: Docker does not answer (connecting to the Docker")


def test_the_exit_statuses_are_batons_own() -> None:
    assert (envcli.EXIT_BAD_INPUT, envcli.EXIT_UNREACHABLE) == (
        messages.EXIT_BAD_INPUT,
        messages.EXIT_UNREACHABLE,
    )


def test_a_bad_spec_in_the_repository_is_one_line_and_exit_2(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({**PROJECT, ".baton/environment.toml": 'test = ["not", "one"]\n'})

    done = baton(tmp_path, "detect", str(upstream.bare))

    assert done.exit_code == 2
    assert done.stderr.splitlines() == [
        "error: .baton/environment.toml: test must be one command (a string)"
    ]


def test_progress_shows_a_command_with_brackets_as_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    envcli._stamped(0.0)("[5/6] python -m pip install -e '.[test]'")

    assert capsys.readouterr().err.rstrip().endswith("[5/6] python -m pip install -e '.[test]'")
