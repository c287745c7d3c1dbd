"""An evaluation corpus: real bugs of real projects, each an instance Baton must fix.

An instance is a folder (`eval/corpus/README.md` says how one is made):

    instance.toml   id, summary, upstream; [source] pypi + version; [environment] (a spec, as
                    `.baton/environment.toml`); [tests] runner, fail_to_pass, pass_to_pass
    break.patch     applied to the published source: puts the bug back, takes its tests out
    test.patch      the tests that catch the bug (FAIL_TO_PASS); never shown to the pipeline
    gold.patch      the fix as the project made it (the oracle plays it)
    issue.json      the report, as a GitHub issue object

    instances = load_corpus(Path("eval/corpus"))
    checkout = materialize(instances[0], workdir, downloads)   # a remote and its base commit
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import BatonError
from orchestrator.core.git import COMMITTER, git_output
from testkit.projects import as_git_repo, python_sdist
from workers.proof import split_diff

INSTANCE_FILE = "instance.toml"
PATCHES = ("break.patch", "test.patch", "gold.patch")


class CorpusError(BatonError, ValueError):
    """Raised when an instance folder is incomplete or invalid; the message names the file."""


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pypi: str
    version: str


class Tests(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    runner: Literal["pytest", "unittest"]
    fail_to_pass: tuple[str, ...] = Field(min_length=1)
    pass_to_pass: tuple[str, ...] = ()


class Instance(BaseModel):
    """One bug: where its code comes from, how to test it, and what resolves it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    summary: str
    upstream: str = ""
    source: Source
    environment: dict[str, Any] = Field(default_factory=dict)
    tests: Tests
    expected_failure: str | None = None
    """What the FAIL_TO_PASS tests print when they fail (for the oracle's reproduction);
    None: the first one's name, which its runner prints."""
    folder: Path = Field(exclude=True)

    def text(self, name: str) -> str:
        return (self.folder / name).read_text(encoding="utf-8")

    @cached_property
    def issue(self) -> dict[str, Any]:
        issue: dict[str, Any] = json.loads(self.text("issue.json"))
        return issue

    @property
    def title(self) -> str:
        return str(self.issue["title"]).strip()

    def files(self, patch: str) -> list[str]:
        """The paths a patch of the instance changes."""
        return list(split_diff(self.text(patch)))


def load_instance(folder: Path) -> Instance:
    """Raises CorpusError naming the file that is missing or wrong."""
    spec = folder / INSTANCE_FILE
    for name in (INSTANCE_FILE, "issue.json", *PATCHES):
        if not (folder / name).is_file():
            raise CorpusError(f"{folder}: {name} is missing")
    try:
        table = tomllib.loads(spec.read_text(encoding="utf-8"))
        instance = Instance.model_validate({**table, "folder": folder.resolve()})
        json.loads((folder / "issue.json").read_text(encoding="utf-8"))["title"]
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise CorpusError(f"{spec}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CorpusError(
            f"{folder / 'issue.json'}: not a GitHub issue with a title ({exc})"
        ) from exc
    if instance.id != folder.name:
        raise CorpusError(f"{spec}: id {instance.id!r} is not the folder's name {folder.name!r}")
    return instance


def load_corpus(root: Path, only: tuple[str, ...] = ()) -> list[Instance]:
    """The instances under `root` (each a folder holding `instance.toml`), by id; with `only`,
    just those (an unknown id is an error)."""
    found = [load_instance(p.parent) for p in sorted(root.glob(f"*/{INSTANCE_FILE}"))]
    if not found:
        raise CorpusError(f"{root}: no instance (a folder holding {INSTANCE_FILE})")
    if only:
        unknown = sorted(set(only) - {i.id for i in found})
        if unknown:
            raise CorpusError(f"{root}: no instance {', '.join(unknown)}")
        found = [i for i in found if i.id in only]
    return found


@dataclass(frozen=True)
class Checkout:
    """An instance's code as a run sees it: a bare repository and its base commit."""

    remote: Path
    commit: str


def materialize(instance: Instance, workdir: Path, downloads: Path) -> Checkout:
    """The published source with `break.patch` applied, committed, as a bare repository in
    `workdir` (the source download is kept in `downloads`).

    Raises:
        CorpusError: the patch does not apply to the published source.
    """
    root = python_sdist(instance.source.pypi, instance.source.version, downloads)
    work = workdir / f"{instance.id}-work"
    shutil.rmtree(work, ignore_errors=True)
    as_git_repo(root, work)
    applied = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", str(instance.folder / "break.patch")],
        cwd=work, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if applied.returncode != 0:
        raise CorpusError(f"{instance.folder / 'break.patch'} does not apply: {applied.stderr}")
    git_output(str(work), ["-C", str(work), "add", "--all", "--force"], config=COMMITTER)
    message = f"{instance.id}: the base (the fix reverted)"
    git_output(str(work), ["-C", str(work), "commit", "-q", "--no-verify", "-m", message],
               config=COMMITTER)  # fmt: skip
    remote = workdir / f"{instance.id}.git"
    shutil.rmtree(remote, ignore_errors=True)
    git_output(str(work), ["clone", "-q", "--bare", str(work), str(remote)])
    shutil.rmtree(work)
    commit = git_output(str(remote), ["-C", str(remote), "rev-parse", "HEAD"]).strip()
    return Checkout(remote, commit)
