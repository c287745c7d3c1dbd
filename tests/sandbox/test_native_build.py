"""A real C extension, MarkupSafe 2.1.5 from PyPI, whose speedups are compiled into its tree by
the setup: the environment keeps the compiled module (none of its tests skipped; its `Markup`
class uses the compiled escape when it can be imported, so tests outside the `_speedups`
parametrization fail with the bug too), and the build
step recompiles it in the sandbox, offline, whenever a C file differs from the one it was built
from — for a fix to the C code, proven, and for a commit that made the kept module stale.

The bug is upstream-shaped and only in the compiled path: `_speedups.c` escapes `>` as `&gr;`
(commit `buggy`), so every `speedups` case of its escape tests fails and every `native` one
passes. One environment image, built at `buggy`, serves every test here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import docker
import pytest

from sandbox import SandboxConfig
from sandbox.build import build_environment, environment_tag, validate_environment
from testkit.native import PROJECT, RIGHT, SPEC, SPEEDUPS, WRONG, commit_speedups, git
from testkit.projects import as_git_repo, python_sdist, summary_counts
from testkit.sinks import MemoryArtifacts
from tests.sandbox.conftest import TEST_LABEL
from tests.sandbox.test_build import DOWNLOADS, by_hand
from workers import proof
from workers.environments import Environment
from workers.mirrors import RepoCache
from workers.outcomes import parse, with_ids
from workers.rebuild import BuildRun
from workers.sandboxes import DockerSandboxes, WorkspaceRequest

REPRO = "tests/test_gt_speedups.py"
REPRO_TEST = """\
from markupsafe import _speedups


def test_the_compiled_escape_writes_gt_for_a_greater_than_sign():
    assert _speedups.escape("a > b") == "a &gt; b"
"""
REPRO_ID = f"{REPRO}::test_the_compiled_escape_writes_gt_for_a_greater_than_sign"


@dataclass(frozen=True)
class Built:
    repo: str
    buggy: str
    env: Environment
    tag: str
    output: str


@pytest.fixture(scope="module")
def built(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Built]:
    root = python_sdist(*PROJECT, DOWNLOADS)
    repo = as_git_repo(root, tmp_path_factory.mktemp("markupsafe") / "repo")
    buggy = commit_speedups(repo, RIGHT, WRONG, "speedups: escape > (wrongly)")
    tree = RepoCache(tmp_path_factory.mktemp("mirrors")).archive(
        str(repo), buggy, uid=1000, gid=1000
    )
    tag = environment_tag("testnative2150")
    labels = {TEST_LABEL: "build"}
    made = build_environment(SPEC, tree, tag=tag, labels=labels, client=docker_client)
    try:
        ran = validate_environment(
            tag, SPEC, tree, test_command=with_ids(SPEC.test or ""), labels={TEST_LABEL: "build"},
            client=docker_client,
        )  # fmt: skip
        baseline = parse(ran.output)
        env = Environment(
            key="testnative2150", tag=tag, spec=SPEC, test_command=SPEC.test, baseline=baseline,
            commit=buggy, products=made.products,
        )  # fmt: skip
        yield Built(str(repo), buggy, env, tag, ran.output)
    finally:
        docker_client.images.remove(tag, force=True)


def _sandboxes(tmp_path: Path, runtime: str | None = None) -> DockerSandboxes:
    return DockerSandboxes(RepoCache(tmp_path / "mirrors"), SandboxConfig(runtime=runtime))


def _request(built: Built, commit: str, builds: list[BuildRun], **spec: object) -> WorkspaceRequest:
    env = built.env
    if spec:
        env = replace(env, spec=env.spec.model_copy(update=spec))
    return WorkspaceRequest(
        repo=built.repo, commit=commit, stage="test", labels={TEST_LABEL: "native"},
        environment=env, on_build=builds.append,
    )  # fmt: skip


@pytest.mark.timeout(900)
def test_the_compiled_module_is_kept_so_no_test_is_skipped_and_the_baseline_is_a_by_hand_run(
    built: Built, docker_client: docker.DockerClient
) -> None:
    outcomes = parse(built.output)
    speedups = [i for i in outcomes.by_id if "speedups" in i]

    assert any(p.startswith("src/markupsafe/_speedups.") and p.endswith(".so")
               for p in built.env.products), built.env.products  # fmt: skip
    assert outcomes.skipped == [], outcomes.skipped
    assert speedups and len(speedups) * 2 <= len(outcomes.by_id)
    escape = "tests/test_escape.py::test_escape[markupsafe."
    native = [i for i in outcomes.by_id if i.startswith(escape + "_native-")]
    compiled = [i for i in outcomes.by_id if i.startswith(escape + "_speedups-") and ">" in i]
    assert native and all(i in outcomes.passed for i in native)
    assert compiled and all(i in outcomes.failed for i in compiled)  # the bug is compiled only
    root = Path(built.repo)
    plain = by_hand(docker_client, built.tag, root, "python -m pytest tests")
    assert (len(outcomes.passed), len(outcomes.failed)) == summary_counts(plain)


@pytest.mark.timeout(900)
def test_a_fix_to_the_c_file_is_compiled_by_the_build_step_and_proven(
    built: Built, tmp_path: Path
) -> None:
    fixed = (Path(built.repo) / SPEEDUPS).read_text().replace(WRONG, RIGHT)
    change = _change(built, {REPRO: REPRO_TEST, SPEEDUPS: fixed})
    sandboxes = _sandboxes(tmp_path)

    def verdict(builds: list[BuildRun], **spec: object) -> proof.Proof:
        request = _request(built, built.buggy, builds, **spec)
        return proof.prove(
            lambda: sandboxes.open(request), change=change,
            command=f"python -m pytest -q {REPRO}", test_files=[REPRO],
            suite_command=None, timeout_s=300, artifacts=MemoryArtifacts(),
        )  # fmt: skip

    builds: list[BuildRun] = []
    proven = verdict(builds)
    unbuilt = verdict([], build=())

    assert proven.fail_to_pass == [REPRO_ID], proven.reason
    assert proven.still_failing == []
    assert [b.failed_command for b in builds] == [None], "the C change was not compiled once"
    assert unbuilt.fail_to_pass == [] and unbuilt.still_failing == [REPRO_ID], (
        "without the build step the stale module must still fail: " + unbuilt.reason
    )


@pytest.mark.timeout(900)
def test_a_commit_that_makes_the_kept_module_stale_gets_it_rebuilt_and_the_build_is_no_change(
    built: Built, tmp_path: Path
) -> None:
    repo = Path(built.repo)
    git(repo, "checkout", "-q", "-b", "upstream-fix", built.buggy)
    upstream_fix = commit_speedups(repo, WRONG, RIGHT, "speedups: escape > as &gt;")
    builds: list[BuildRun] = []

    sandboxes = _sandboxes(tmp_path, runtime="runsc")  # as the workers run them
    with sandboxes.open(_request(built, upstream_fix, builds)) as workspace:
        ran = workspace.run(
            ["python", "-c", "from markupsafe import _speedups; print(_speedups.escape('>'))"],
            timeout_s=120,
        )
        again = workspace.run(["true"], timeout_s=60)
        change = workspace.diff()

    assert ran.output.strip() == "&gt;", ran.output
    assert again.exit_code == 0
    assert len(builds) == 1 and builds[0].failed_command is None
    assert change == "", "the rebuilt products must not be part of the change"


def _change(built: Built, files: dict[str, str]) -> str:
    """The diff from the buggy commit that writes `files`, as a stage would hand it on."""
    repo = Path(built.repo)
    git(repo, "checkout", "-q", built.buggy)
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    diff = git(repo, "diff", "--cached", "--binary", "HEAD")
    git(repo, "reset", "-q", "--hard", built.buggy)
    return diff + "\n"
