"""What a fix changes, file by file, read from git on the worker host, and whether it may be
published.

The sandbox that produced a diff is not trusted (a test command can rewrite its `.git/config`
or plant a symlink), so the publisher applies the diff to its own copy and reads the result
back from git's index (`workers.publish`): `read_changes` turns git's listing into every changed
file with its status and classes (`orchestrator.core.rules.ChangeClass`), refusing symlinks,
submodules and paths inside `.git` always, and `ChangePolicy.refusal` says what the pipeline
does not allow.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from orchestrator.core.rules import ChangeClass

SYMLINK_MODE, GITLINK_MODE, EXECUTABLE_MODE = "120000", "160000", "100755"
STATUS = {"A": "added", "M": "modified", "D": "deleted", "T": "retyped"}

CI_FOLDERS = (".github", ".gitlab", ".circleci", ".buildkite", ".azure-pipelines", ".woodpecker")
CI_FILES = (
    ".gitlab-ci.yml", ".travis.yml", "azure-pipelines.yml", "Jenkinsfile", ".drone.yml",
    "bitbucket-pipelines.yml", "appveyor.yml", ".appveyor.yml", ".pre-commit-config.yaml",
    "CODEOWNERS", ".gitattributes", ".gitmodules",
)  # fmt: skip
DEPENDENCY_FILES = (
    "pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "requirements*.in",
    "constraints*.txt", "Pipfile", "Pipfile.lock", "poetry.lock", "uv.lock", "pdm.lock",
    "environment.yml", "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock",
    "pnpm-lock.yaml", "bun.lockb", "go.mod", "go.sum", "Cargo.toml", "Cargo.lock", "Gemfile",
    "Gemfile.lock", "*.gemspec", "composer.json", "composer.lock", "pom.xml", "build.gradle",
    "build.gradle.kts", "gradle.lockfile", "mix.exs", "mix.lock",
)  # fmt: skip
DEPENDENCY_PATHS = ("requirements/*.txt", "requirements/*.in", ".baton/environment.toml")


class UnsafeChangeError(ValueError):
    """Raised when a change holds what is never published: a symlink, a submodule, a path
    inside `.git`. The message names the file."""


@dataclass(frozen=True)
class ChangedFile:
    path: str
    status: str
    """`added`, `modified`, `deleted` or `retyped`."""
    classes: tuple[ChangeClass, ...] = ()


@dataclass(frozen=True)
class ChangePolicy:
    """The files a change is meant to touch (None: any) and the classes published anyway."""

    planned: frozenset[str] | None = None
    allow: frozenset[ChangeClass] = field(default_factory=frozenset)

    @classmethod
    def of(cls, planned: Iterable[str] | None, allow: Iterable[ChangeClass]) -> ChangePolicy:
        return cls(
            frozenset(_normal(path) for path in planned) if planned is not None else None,
            frozenset(allow),
        )

    def classify(self, path: str, status: str, *, binary: bool, executable: bool) -> ChangedFile:
        classes = []
        if self.planned is not None and _normal(path) not in self.planned:
            classes.append(ChangeClass.UNPLANNED)
        if _is_ci(path):
            classes.append(ChangeClass.CI)
        if _is_dependency(path):
            classes.append(ChangeClass.DEPENDENCIES)
        if binary:
            classes.append(ChangeClass.BINARY)
        if executable:
            classes.append(ChangeClass.EXECUTABLE)
        return ChangedFile(path, status, tuple(classes))

    def refusal(self, files: Iterable[ChangedFile]) -> str | None:
        """Why the change may not be published (each file and its classes not allowed), or
        None when it may."""
        refused = [
            f"{f.path} ({', '.join(c.value for c in f.classes if c not in self.allow)})"
            for f in files
            if any(c not in self.allow for c in f.classes)
        ]
        if not refused:
            return None
        return (
            f"the change holds what this pipeline does not publish: {'; '.join(refused)} "
            "(allow a class with the publishing stage's `publish.allow`)"
        )


def read_changes(raw: bytes, numstat: bytes, policy: ChangePolicy) -> list[ChangedFile]:
    """The changed files from `git diff-index --cached --raw -z --no-renames <commit>` and the
    same with `--numstat`, classified by `policy`.

    Raises:
        UnsafeChangeError: a file is a symlink or a submodule, or lies inside `.git`.
    """
    binary = _binary_paths(numstat)
    fields = raw.split(b"\0")
    files = []
    for header, name in zip(fields[0::2], fields[1::2], strict=False):
        if not header.startswith(b":"):
            continue
        old_mode, new_mode, _, _, status = header[1:].decode().split(" ")
        path = name.decode("utf-8", errors="surrogateescape")
        _check_safe(path, new_mode)
        executable = new_mode == EXECUTABLE_MODE and old_mode != EXECUTABLE_MODE
        files.append(
            policy.classify(
                path, STATUS.get(status[0], status), binary=path in binary, executable=executable
            )
        )
    return files


def listing(files: Iterable[ChangedFile], policy: ChangePolicy) -> str:
    """The pull request's list of changed files, each with its status and classes."""
    lines = ["Changed files, as Baton checked them:"]
    for f in files:
        kinds = [c.value + (" (allowed)" if c in policy.allow else "") for c in f.classes]
        if not kinds:
            kinds = ["planned" if policy.planned is not None else "code"]
        lines.append(f"- `{f.path}` — {f.status}; {', '.join(kinds)}")
    return "\n".join(lines)


def _binary_paths(numstat: bytes) -> set[str]:
    found = set()
    for record in numstat.split(b"\0"):
        added, _, rest = record.partition(b"\t")
        deleted, _, path = rest.partition(b"\t")
        if added == b"-" and deleted == b"-" and path:
            found.add(path.decode("utf-8", errors="surrogateescape"))
    return found


def _check_safe(path: str, mode: str) -> None:
    if mode == SYMLINK_MODE:
        raise UnsafeChangeError(f"{path} is a symlink; a published change holds none")
    if mode == GITLINK_MODE:
        raise UnsafeChangeError(f"{path} is a submodule; a published change holds none")
    if any(part.lower() == ".git" for part in PurePosixPath(path).parts):
        raise UnsafeChangeError(f"{path} lies inside .git")


def _normal(path: str) -> str:
    return PurePosixPath(path.removeprefix("./")).as_posix()


def _is_ci(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return parts[0] in CI_FOLDERS or parts[-1] in CI_FILES


def _is_dependency(path: str) -> bool:
    name = PurePosixPath(path).name
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in DEPENDENCY_FILES) or any(
        fnmatch.fnmatchcase(path, pattern) for pattern in DEPENDENCY_PATHS
    )
