"""An evaluation corpus: real bugs of real projects, each an instance Baton must fix.

An instance is a folder (`eval/corpus/README.md` says how one is made):

    instance.toml   id, summary, upstream; [source] pypi + version, or git + commit;
                    [environment] (a spec, as `.baton/environment.toml`); [tests] runner,
                    fail_to_pass, pass_to_pass
    break.patch     (pypi) applied to the published source: puts the bug back, takes its tests out
    base.tar.gz     (git) the base tree, `git archive` of the fix's parent commit: no clone needed
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
import tarfile
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from orchestrator.core.errors import BatonError
from orchestrator.core.git import COMMITTER, git_output
from testkit.projects import as_git_repo, python_sdist
from workers.proof import split_diff

INSTANCE_FILE = "instance.toml"
PATCHES = ("test.patch", "gold.patch")
"""Every instance's; its base comes from `BREAK_PATCH` (a PyPI source) or `BASE_ARCHIVE` (git)."""
BREAK_PATCH = "break.patch"
BASE_ARCHIVE = "base.tar.gz"


class CorpusError(BatonError, ValueError):
    """Raised when an instance folder is incomplete or invalid; the message names the file."""


class Source(BaseModel):
    """A PyPI sdist, which `break.patch` turns into the base."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pypi: str
    version: str

    @property
    def base_file(self) -> str:
        return BREAK_PATCH

    def __str__(self) -> str:
        return f"{self.pypi} {self.version} with the bug put back"


class GitSource(BaseModel):
    """A commit of a git repository, whose tree the instance folder holds as `base.tar.gz`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    git: str = Field(min_length=1)
    """Where the commit comes from (a clone URL): provenance; nothing is cloned."""
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    """The base commit (the fix's parent), 40 hex digits."""

    @property
    def base_file(self) -> str:
        return BASE_ARCHIVE

    def __str__(self) -> str:
        return f"{self.git} at {self.commit[:12]}"


def _source_kind(table: Any) -> str:
    """Which source a `[source]` table is: git when it has a `git` key, else PyPI."""
    if isinstance(table, dict):
        return "git" if "git" in table else "pypi"
    return "git" if isinstance(table, GitSource) else "pypi"


class Tests(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    runner: Literal["pytest", "unittest"]
    fail_to_pass: tuple[str, ...] = Field(min_length=1)
    pass_to_pass: tuple[str, ...] = ()


class Instance(BaseModel):
    """One bug: where its code comes from, how to test it, and what resolves it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """A folder's name: `[a-z0-9.-]` in eval/corpus; SWE-bench's ids (`owner__name-123`)."""
    summary: str
    upstream: str = ""
    source: Annotated[
        Annotated[Source, Tag("pypi")] | Annotated[GitSource, Tag("git")],
        Discriminator(_source_kind),
    ]
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
        _require(folder, name)
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
    _require(folder, instance.source.base_file)
    return instance


def _require(folder: Path, name: str) -> None:
    if not (folder / name).is_file():
        raise CorpusError(f"{folder}: {name} is missing")


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
    """The instance's base, committed, as a bare repository in `workdir`: the published sdist
    with `break.patch` applied (the download is kept in `downloads`), or the tree in
    `base.tar.gz`.

    Raises:
        CorpusError: the patch does not apply to the published source, or the archive is not
            a tree that stays inside its folder.
    """
    work = workdir / f"{instance.id}-work"
    shutil.rmtree(work, ignore_errors=True)
    if isinstance(instance.source, GitSource):
        unpack_base(instance.folder / BASE_ARCHIVE, work)
        git_output(str(work), ["-C", str(work), "init", "-q", "--initial-branch=main"])
        message = f"{instance.id}: the base ({instance.source})"
    else:
        _broken_sdist(instance, instance.source, work, downloads)
        message = f"{instance.id}: the base (the fix reverted)"
    git_output(str(work), ["-C", str(work), "add", "--all", "--force"], config=COMMITTER)
    git_output(str(work), ["-C", str(work), "commit", "-q", "--no-verify", "-m", message],
               config=COMMITTER)  # fmt: skip
    remote = workdir / f"{instance.id}.git"
    shutil.rmtree(remote, ignore_errors=True)
    git_output(str(work), ["clone", "-q", "--bare", str(work), str(remote)])
    shutil.rmtree(work)
    commit = git_output(str(remote), ["-C", str(remote), "rev-parse", "HEAD"]).strip()
    return Checkout(remote, commit)


def _broken_sdist(instance: Instance, source: Source, work: Path, downloads: Path) -> None:
    root = python_sdist(source.pypi, source.version, downloads)
    as_git_repo(root, work)
    applied = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", str(instance.folder / BREAK_PATCH)],
        cwd=work, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if applied.returncode != 0:
        raise CorpusError(f"{instance.folder / BREAK_PATCH} does not apply: {applied.stderr}")


MAX_BASE_BYTES = 512 * 1024 * 1024
MAX_BASE_MEMBERS = 100_000
"""What a base archive may unpack to: far above a project's sdist-sized tree."""


def unpack_base(archive: Path, dest: Path) -> None:
    """The tree in `archive` (a gzipped tar, as `git archive` writes it) unpacked into `dest`,
    which must not exist. Hostile archives are refused, nothing of them kept: a member whose
    path is absolute or climbs out (`..`), a link that points out of `dest`, a device or FIFO
    (tarfile's `data` filter), and a `.git` folder, which would be a repository of its own; and
    an archive that would unpack to more than MAX_BASE_BYTES or MAX_BASE_MEMBERS files (a
    gzip bomb), before anything is written.

    Raises:
        CorpusError: naming the archive and the member.
    """
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            size = sum(member.size for member in members)
            if size > MAX_BASE_BYTES or len(members) > MAX_BASE_MEMBERS:
                raise CorpusError(
                    f"{archive}: unpacks to {size:,} bytes in {len(members):,} members; a base "
                    f"may hold at most {MAX_BASE_BYTES:,} bytes in {MAX_BASE_MEMBERS:,}"
                )
            for member in members:
                parts = Path(member.name).parts
                if member.name.startswith("/") or ".." in parts:
                    raise CorpusError(f"{archive}: {member.name}: a path out of the tree")
                if ".git" in parts:
                    raise CorpusError(f"{archive}: {member.name}: a .git folder in the tree")
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, CorpusError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, CorpusError):
            raise
        raise CorpusError(f"{archive}: not a tree that can be unpacked safely: {exc}") from exc
