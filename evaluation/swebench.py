"""SWE-bench records read as evaluation instances: `baton eval FILE.jsonl` (or a `.json` list).

A record names a repository (`repo`, "owner/name") and a commit in it (`base_commit`); the
repository itself comes from the command line, as a local git directory or a clone URL:

    repos = Repos(folder=Path("/srv/mirrors"), given={"pallets/flask": "https://…/flask.git"})
    instances = load_records(Path("swebench.jsonl"), repos, workdir)

Each record becomes an `Instance` whose folder, under `workdir`, holds what a corpus folder
holds for a git source: `base.tar.gz` (`git archive` of `base_commit`), `test.patch`,
`gold.patch` and `issue.json` (the problem statement: its first line the title, the rest the
body). SWE-bench records carry no environment: the base tree's is detected as `baton env
detect` does (`sandbox.detection`), with `version` given to a build that reads its version
from git; a record's own `environment` table (Baton's addition) replaces it.

Every record is read and checked, and every repository and commit found, before anything is
written: a malformed record is a `CorpusError` naming the file, the line (the record's index
in a `.json` list) and the field.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evaluation.corpus import BASE_ARCHIVE, CorpusError, Instance, unpack_base
from orchestrator.core.errors import BatonError
from orchestrator.core.git import git_output, git_output_bytes, is_url
from sandbox.detection import detection
from sandbox.environment import from_table, to_toml
from sandbox.errors import EnvironmentSpecError

CLONE_TIMEOUT_S = 600.0
UNITTEST = re.compile(r"-m\s+unittest\b")
"""A test command that runs unittest: its test ids are `module.Class.test` (SWE-bench's are
pytest node ids for every other repository)."""


class Record(BaseModel):
    """One SWE-bench task instance, as its datasets hold it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=200)
    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    base_commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    patch: str = Field(min_length=1)
    """The fix, without its tests (the oracle plays it)."""
    test_patch: str = Field(min_length=1)
    FAIL_TO_PASS: tuple[str, ...] = Field(min_length=1)
    PASS_TO_PASS: tuple[str, ...] = ()
    problem_statement: str = Field(min_length=1)
    version: str | None = None
    environment_setup_commit: str | None = None
    hints_text: str | None = None
    created_at: str | None = None
    difficulty: str | None = None
    """SWE-bench Verified's annotation; informative."""
    environment: dict[str, Any] | None = None
    """Baton's addition: an environment spec table that replaces the detected one."""

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench stores these lists as JSON text; a real list is taken as it is."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON list of test ids ({exc})") from None
        return value

    @field_validator("environment")
    @classmethod
    def _spec(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            from_table(value, origin="environment")  # EnvironmentSpecError is a ValueError
        return value

    @property
    def number(self) -> int:
        """The number SWE-bench's id ends with (the upstream pull request's), else 0."""
        found = re.search(r"-(\d+)$", self.instance_id)
        return int(found.group(1)) if found else 0


@dataclass(frozen=True)
class Repos:
    """Where records' repositories are: `given` maps "owner/name" to a local path or a clone
    URL; otherwise `folder` is searched for a git directory (bare or not) named `owner+name`,
    `owner+name/repo`, `name`, `owner+name.git` or `name.git`."""

    folder: Path | None = None
    given: Mapping[str, str] = field(default_factory=dict)

    def candidates(self, repo: str) -> Iterator[str]:
        if repo in self.given:
            yield self.given[repo]
            return
        if self.folder is None:
            return
        owner_name, name = repo.replace("/", "+"), repo.split("/")[1]
        for relative in (owner_name, f"{owner_name}/repo", name, f"{owner_name}.git",
                         f"{name}.git"):  # fmt: skip
            yield str(self.folder / relative)


def parse_repo_option(values: tuple[str, ...]) -> dict[str, str]:
    """`--repo owner/name=PATH_OR_URL` values as a mapping.

    Raises:
        CorpusError: a value is not `owner/name=WHERE`.
    """
    given = {}
    for value in values:
        name, sep, where = value.partition("=")
        if not sep or not where or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", name):
            raise CorpusError(f"--repo {value!r}: give owner/name=PATH_OR_URL")
        given[name] = where
    return given


def read_records(path: Path) -> list[tuple[int, Record]]:
    """The records of a `.jsonl` file (one JSON object a line; blank lines skipped) or of a
    `.json` file (a list of objects), each with its line (its index from 1, in a list).

    Raises:
        CorpusError: `path:LINE: FIELD: what is wrong`, or a repeated instance_id.
    """
    where = {".jsonl": "line", ".json": "record"}.get(path.suffix)
    if where is None:
        raise CorpusError(f"{path}: a SWE-bench file is .jsonl or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: not a readable text file ({exc})") from exc
    records: list[tuple[int, Record]] = []
    seen: dict[str, int] = {}
    for number, item in _json_lines(path, text) if where == "line" else _json_list(path, text):
        at = _at(path, number)
        if not isinstance(item, dict):
            raise CorpusError(f"{at}: not a JSON object")
        try:
            record = Record.model_validate(item)
        except ValidationError as exc:
            raise CorpusError(f"{at}: {_problems(exc)}") from exc
        if record.instance_id in seen:
            raise CorpusError(
                f"{at}: instance_id: {record.instance_id!r} repeats {where} "
                f"{seen[record.instance_id]}"
            )
        seen[record.instance_id] = number
        records.append((number, record))
    if not records:
        raise CorpusError(f"{path}: no SWE-bench record")
    return records


def _at(path: Path, number: int) -> str:
    """Where a record is, as an error names it: its line, or its index in a `.json` list."""
    return f"{path}: record {number}" if path.suffix == ".json" else f"{path}:{number}"


def _json_lines(path: Path, text: str) -> list[tuple[int, Any]]:
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append((number, json.loads(line)))
            except ValueError as exc:
                raise CorpusError(f"{path}:{number}: not a JSON object ({exc})") from exc
    return items


def _json_list(path: Path, text: str) -> list[tuple[int, Any]]:
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise CorpusError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(items, list):
        raise CorpusError(f"{path}: not a JSON list of SWE-bench records")
    return list(enumerate(items, 1))


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        ".".join(str(p) for p in error["loc"]) + ": " + error["msg"].removeprefix("Value error, ")
        for error in exc.errors()
    )


def load_records(
    path: Path, repos: Repos, workdir: Path, only: tuple[str, ...] = ()
) -> list[Instance]:
    """The instances of a SWE-bench file, their folders written under `workdir` (repositories
    given by URL are cloned there too); with `only`, just those ids (an unknown one is an
    error). Nothing is written unless every chosen record is valid and its commit found.

    Raises:
        CorpusError: naming the file, the line and the field that is wrong.
    """
    records = read_records(path)
    if only:
        unknown = sorted(set(only) - {r.instance_id for _, r in records})
        if unknown:
            raise CorpusError(f"{path}: no record {', '.join(unknown)}")
        records = [(n, r) for n, r in records if r.instance_id in only]
    clones = workdir / "clones"
    found: dict[str, str] = {}
    for number, record in records:
        at = _at(path, number)
        if record.repo not in found:
            found[record.repo] = _repository(record.repo, repos, clones, at)
        git_dir = found[record.repo]
        try:
            git_output(git_dir, ["--git-dir", git_dir, "cat-file", "-e",
                                 f"{record.base_commit}^{{commit}}"])  # fmt: skip
        except BatonError:
            raise CorpusError(f"{at}: base_commit: {record.base_commit} is not a commit of "
                              f"{record.repo} ({git_dir})") from None  # fmt: skip
    folders = workdir / "instances"
    try:
        return [_instance(record, found[record.repo], folders, path) for _, record in records]
    except BaseException:
        shutil.rmtree(folders, ignore_errors=True)
        raise


def _repository(repo: str, repos: Repos, clones: Path, at: str) -> str:
    """The git directory of `repo`, cloned (bare) into `clones` when given by URL."""
    tried = []
    for where in repos.candidates(repo):
        tried.append(where)
        if is_url(where):
            dest = clones / repo.replace("/", "+")
            if not dest.exists():
                clones.mkdir(parents=True, exist_ok=True)
                try:
                    git_output(where, ["clone", "-q", "--bare", where, str(dest)],
                               timeout_s=CLONE_TIMEOUT_S)  # fmt: skip
                except BatonError as exc:
                    raise CorpusError(f"{at}: repo: {exc}") from exc
            return str(dest)
        if Path(where).is_dir():
            try:
                git_dir = git_output(where, ["-C", where, "rev-parse", "--absolute-git-dir"])
            except BatonError:
                continue
            root = Path(where).resolve()
            if Path(git_dir) in (root, root / ".git"):  # its own, not a repository around it
                return git_dir
    if not tried:
        raise CorpusError(f"{at}: repo: no repository for {repo}; give --repos DIR or "
                          f"--repo {repo}=PATH_OR_URL")  # fmt: skip
    raise CorpusError(f"{at}: repo: {repo} is not a git repository at {', '.join(tried)}")


def _instance(record: Record, git_dir: str, folders: Path, path: Path) -> Instance:
    folder = folders / record.instance_id
    folder.mkdir(parents=True)
    archive = git_output_bytes(git_dir, ["--git-dir", git_dir, "archive", "--format=tar.gz",
                                         record.base_commit])  # fmt: skip
    (folder / BASE_ARCHIVE).write_bytes(archive)
    (folder / "test.patch").write_text(record.test_patch, encoding="utf-8")
    (folder / "gold.patch").write_text(record.patch, encoding="utf-8")
    (folder / "issue.json").write_text(json.dumps(issue(record), indent=1), encoding="utf-8")
    environment = record.environment or detected_environment(folder / BASE_ARCHIVE, record)
    table = {
        "id": record.instance_id,
        "summary": record.problem_statement.strip().splitlines()[0][:200],
        "upstream": f"SWE-bench {record.instance_id} ({path.name}), "
        f"https://github.com/{record.repo} at {record.base_commit}",
        "source": {"git": f"https://github.com/{record.repo}", "commit": record.base_commit},
        "environment": environment,
        "tests": {
            "runner": runner(environment),
            "fail_to_pass": list(record.FAIL_TO_PASS),
            "pass_to_pass": list(record.PASS_TO_PASS),
        },
        "folder": folder.resolve(),
    }
    try:
        return Instance.model_validate(table)
    except ValidationError as exc:
        raise CorpusError(f"{path}: {record.instance_id}: {_problems(exc)}") from exc


def runner(environment: Mapping[str, Any]) -> str:
    """The runner whose ids the record's tests are in: unittest's when the test command runs
    it, else pytest's."""
    return "unittest" if UNITTEST.search(str(environment.get("test") or "")) else "pytest"


def issue(record: Record) -> dict[str, Any]:
    """The problem statement as a GitHub issue object: its first line the title."""
    title, _, body = record.problem_statement.strip().partition("\n")
    return {
        "number": record.number,
        "title": title.strip(),
        "body": body.strip(),
        "html_url": f"https://github.com/{record.repo}/issues/{record.number}",
        "state": "open",
        "user": {"login": "swe-bench"},
        "labels": [],
    }


def detected_environment(archive: Path, record: Record) -> dict[str, Any]:
    """What `baton env detect` would say for the base tree, as a spec table."""
    with tempfile.TemporaryDirectory(prefix="baton-swebench-") as tmp:
        root = Path(tmp) / "tree"
        try:
            unpack_base(archive, root)
        except (CorpusError, tarfile.TarError) as exc:
            raise CorpusError(f"{record.instance_id}: {exc}") from exc
        try:
            found = detection(root, version=record.version)
        except EnvironmentSpecError as exc:
            raise CorpusError(f"{record.instance_id}: no environment detected: {exc}") from exc
    table: dict[str, Any] = tomllib.loads(to_toml(found.spec))
    return table
