"""Environments for real repositories: built from the base image with the registries in reach,
validated by running the repository's own tests in a hardened sandbox with no network.

The projects are real, published by their maintainers, with their own test suites: source
distributions from PyPI and a package from the npm registry (`testkit.projects`). Each
environment's baseline (our per-test parse) is compared with the runner's own summary line,
run by hand in the same image."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandbox.build import (
    BUILD_LABEL,
    KEY_LABEL,
    EnvironmentBuildError,
    build_environment,
    environment_tag,
    validate_environment,
)
from sandbox.environment import EnvironmentSpec, detect, environment_key
from testkit.projects import by_hand as run_by_hand
from testkit.projects import npm_package, python_sdist, summary_counts, tree_tar
from tests.sandbox.conftest import TEST_LABEL
from workers.outcomes import parse, with_ids

ROOT = Path(__file__).resolve().parents[2]
DOWNLOADS = ROOT / "build" / "test-projects"
"""Where the projects' downloads are kept between test sessions (git ignores build/)."""

PYTHON_PROJECTS = [
    # (name, version, needs third-party packages to run its tests, setup its maintainers'
    # files do not say and a user would add in .baton/environment.toml)
    ("six", "1.16.0", True, ()),  # pytest
    ("toolz", "0.12.1", True, ()),  # pytest; tests inside the package
    # requirements-dev.txt: pytest, hypothesis, freezegun; its setup.cfg turns warnings into
    # errors, and pytest 9 warns about its parametrize generators: a user pins pytest
    ("python-dateutil", "2.9.0.post0", True, ("python -m pip install 'pytest<8'",)),
    ("more-itertools", "10.2.0", False, ()),  # unittest (requirements/development.txt: tools)
    ("cachetools", "5.3.3", True, ()),  # tox.ini deps: pytest
]
CANARY = "canary-secret-7f3a9c1e5b"


@pytest.fixture(scope="module")
def built_tags(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Environment images the tests build, removed at the end."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        try:
            docker_client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def build(
    root: Path, client: docker.DockerClient, tags: list[str], spec: EnvironmentSpec | None = None
) -> tuple[EnvironmentSpec, str, str]:
    """Build and validate `root`'s environment: (spec, tag, the validating run's output)."""
    spec = spec or detect(root)
    tag = environment_tag("test" + environment_key(spec, root, "test", repository=root.name)[:12])
    tree = tree_tar(root)
    tags.append(tag)
    build_environment(spec, tree, tag=tag, labels={TEST_LABEL: "build"}, client=client)
    assert spec.test is not None, f"{root.name}: no test command was detected"
    ran = validate_environment(
        tag, spec, tree, test_command=with_ids(spec.test), labels={TEST_LABEL: "build"},
        client=client,
    )  # fmt: skip
    return spec, tag, ran.output


def by_hand(client: docker.DockerClient, tag: str, root: Path, command: str) -> str:
    """`command` run in `tag` as a person would (`testkit.projects.by_hand`)."""
    return run_by_hand(client, tag, root, command, {TEST_LABEL: "by-hand"})


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "version", "third_party", "added"), PYTHON_PROJECTS)
def test_a_real_python_project_builds_and_its_baseline_matches_its_runner(
    docker_client: docker.DockerClient,
    built_tags: list[str],
    name: str,
    version: str,
    third_party: bool,
    added: tuple[str, ...],
) -> None:
    root = python_sdist(name, version, DOWNLOADS)
    detected = detect(root)
    wanted = detected.model_copy(update={"setup": (*detected.setup, *added)})

    spec, tag, output = build(root, docker_client, built_tags, wanted)
    outcomes = parse(output)
    plain = by_hand(docker_client, tag, root, spec.test or "")

    assert outcomes.by_id, f"{name}: no test named in:\n{output[-2000:]}"
    assert (len(outcomes.passed), len(outcomes.failed)) == summary_counts(plain)
    assert len(outcomes.passed) > 0.9 * len(outcomes.by_id)  # the environment works
    own_install = {
        "python -m pip install -e .",
        "python -m pip install --upgrade pip setuptools wheel",
    }
    detected_installs = [c for c in detected.setup if "pip install" in c and c not in own_install]
    if third_party:
        assert detected_installs  # found in its own files, not added by this test


@pytest.mark.timeout(900)
def test_an_npm_package_builds_and_its_tap_results_are_the_baseline(
    docker_client: docker.DockerClient, built_tags: list[str]
) -> None:
    root = npm_package("minimist", "1.2.8", DOWNLOADS)
    spec = detect(root)
    assert spec.setup == ("npm install --no-audit --no-fund",)  # no lockfile in the package
    # its own test script runs tape under nyc, whose cache goes into node_modules, which the
    # agent phase (read-only root) cannot write: tape alone runs the same tests
    tests_only = spec.model_copy(update={"test": "npx tape 'test/**/*.js'"})

    _, tag, output = build(root, docker_client, built_tags, tests_only)
    outcomes = parse(output)
    plain = by_hand(docker_client, tag, root, "npx tape 'test/**/*.js'")
    tap_summary = re.search(r"^# pass\s+(\d+)", plain, re.MULTILINE)

    assert outcomes.runner == "tap"
    assert tap_summary is not None, plain[-1500:]
    assert len(outcomes.passed) > 0
    assert not outcomes.failed
    asserts = len(re.findall(r"^ok \d+", plain, re.MULTILINE))
    assert asserts == int(tap_summary.group(1))


def test_a_failing_setup_command_names_itself_with_its_output_and_leaves_no_image(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    (tmp_path / "requirements.txt").write_text("this-package-does-not-exist-baton==0.0.1\n")
    spec = detect(tmp_path)
    tag = environment_tag("test-failing-setup")

    # A label of this test's own: other test processes build at the same time.
    mine = {TEST_LABEL: f"failing-setup-{tmp_path.name}-{os.getpid()}"}

    with pytest.raises(EnvironmentBuildError) as raised:
        build_environment(spec, tree_tar(tmp_path), tag=tag, labels=mine, client=docker_client)

    message = str(raised.value)
    assert message.startswith(
        "setup command 'cd /workspace && python -m pip install -r requirements.txt' exited with 1"
    )
    assert "this-package-does-not-exist-baton" in message.splitlines()[-1] or (
        "No matching distribution" in message
    )
    assert "$ cd /workspace && python -m pip install -r requirements.txt" in raised.value.log
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
    label = "{}={}".format(*mine.popitem())
    leftover = docker_client.containers.list(all=True, filters={"label": ["baton.build=1", label]})
    assert leftover == []


def test_tests_that_need_the_network_fail_in_the_agent_phase_saying_so(
    docker_client: docker.DockerClient, built_tags: list[str], tmp_path: Path
) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_net.py").write_text(
        "import urllib.request\n\n"
        "def test_reaches_pypi():\n"
        "    urllib.request.urlopen('https://pypi.org/simple/', timeout=5)\n"
    )

    spec, _, output = build(tmp_path, docker_client, built_tags)
    outcomes = parse(output)

    assert spec.test == "python -m pytest"
    assert outcomes.failed == ["tests/test_net.py::test_reaches_pypi"]
    assert re.search(r"Temporary failure in name resolution|Network is unreachable", output)


def test_a_workers_secrets_reach_no_build_no_log_no_layer_and_no_sandbox(
    docker_client: docker.DockerClient,
    built_tags: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_GITHUB_TOKEN", CANARY)
    monkeypatch.setenv("GOOGLE_API_KEY", CANARY)
    (tmp_path / "requirements.txt").write_text("iniconfig==2.0.0\n")
    (tmp_path / "test_env.py").write_text(
        "import os\n\ndef test_env():\n    print(sorted(os.environ.items()))\n"
    )
    spec = detect(tmp_path).model_copy(update={"setup": (*detect(tmp_path).setup, "env")})
    tag = environment_tag("test-canary")
    built_tags.append(tag)

    built = build_environment(spec, tree_tar(tmp_path), tag=tag, client=docker_client)
    ran = validate_environment(
        tag, spec, tree_tar(tmp_path), test_command="python -m pytest -s -rA",
        client=docker_client,
    )  # fmt: skip

    assert "PIP_CERT=" in built.log  # the build's own `env` ran, and printed its environment
    image = docker_client.api.inspect_image(tag)
    assert CANARY not in json.dumps(image)
    assert CANARY not in json.dumps(docker_client.api.history(tag))
    assert CANARY not in built.log
    assert "PIP_CERT" not in json.dumps(image["Config"]["Env"])  # build settings stay there
    assert image["Config"]["Labels"][KEY_LABEL] == "test-canary"
    assert image["Config"]["Labels"][BUILD_LABEL] == ""  # sandboxes from it are no builds
    saved = subprocess.run(
        ["docker", "save", tag], capture_output=True, check=True, timeout=300
    ).stdout
    assert CANARY.encode() not in saved
    assert "PASSED test_env.py::test_env" in ran.output
    assert CANARY not in ran.output
