"""Classes of changed files, by path: what the publisher refuses unless a pipeline allows it."""

from __future__ import annotations

import pytest

from orchestrator.core.rules import ChangeClass
from workers.changes import ChangePolicy

CI, DEPS, UNPLANNED = ChangeClass.CI, ChangeClass.DEPENDENCIES, ChangeClass.UNPLANNED


@pytest.mark.parametrize(
    ("path", "classes"),
    [
        ("src/app.py", ()),
        ("./src/app.py", ()),
        ("tests/test_app.py", (UNPLANNED,)),
        (".github/workflows/ci.yml", (UNPLANNED, CI)),
        (".github/CODEOWNERS", (UNPLANNED, CI)),
        ("deploy/Jenkinsfile", (UNPLANNED, CI)),
        (".gitlab-ci.yml", (UNPLANNED, CI)),
        ("pkg/.gitattributes", (UNPLANNED, CI)),
        ("requirements-dev.txt", (UNPLANNED, DEPS)),
        ("requirements/test.txt", (UNPLANNED, DEPS)),
        ("web/package-lock.json", (UNPLANNED, DEPS)),
        (".baton/environment.toml", (UNPLANNED, DEPS)),
        ("docs/github.md", (UNPLANNED,)),
        ("src/requirements.py", (UNPLANNED,)),
    ],
)
def test_a_path_gets_the_classes_its_place_and_name_give_it(
    path: str, classes: tuple[ChangeClass, ...]
) -> None:
    policy = ChangePolicy.of(["src/app.py"], [])
    assert policy.classify(path, "added", binary=False, executable=False).classes == classes


def test_a_refusal_names_each_file_with_only_the_classes_not_allowed() -> None:
    policy = ChangePolicy.of(["app.py"], [UNPLANNED])
    files = [
        policy.classify(path, "added", binary=False, executable=False)
        for path in ("app.py", "notes.md", ".github/workflows/x.yml")
    ]

    assert policy.refusal(files[:2]) is None
    refusal = policy.refusal(files)
    assert refusal is not None
    assert "publish: .github/workflows/x.yml (ci) (allow" in refusal
