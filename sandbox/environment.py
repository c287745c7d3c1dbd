"""What a repository needs before its tests can run: its environment spec, and the key of the
image built from it.

A repository says it in `.baton/environment.toml`; otherwise the spec is detected from what the
repository holds (`sandbox.detection`): Python (`pyproject.toml`, `setup.py`/`setup.cfg`,
`requirements.txt`, the set of dependencies declared for the tests, its native build), Node
(`package.json`, with `npm ci` when it has a lockfile and `npm run build` when it has that
script), or nothing to install. The key hashes the base image, the repository, the spec and
the contents of the files the spec was read from (`EnvironmentSpec.inputs`): a change to a
dependency file makes a new environment, a change to any other file reuses the one there is.
The repository is part of it because its build runs the repository's own code (`setup.py`, the
spec's commands): another repository with the same dependency files must never be handed an
image a hostile one built.

    spec = detect(Path("/srv/checkout"))
    key = environment_key(spec, Path("/srv/checkout"), base_image_id, repository="<repo id>")

Pure: reads files, runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox.errors import EnvironmentSpecError

SPEC_FILE = ".baton/environment.toml"
"""Where a repository states its environment (relative to its root)."""

VENV = "/opt/baton/venv"
"""The virtualenv a Python environment installs into; first on the agent phase's PATH."""

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

KEY_CHARS = 16
"""Hex digits of the key that name the image (`baton-env:<key>`): 64 bits."""
KEY_FORMAT = "workspace-seed"
"""Hashed into every key: what an environment image holds and where. Changed when a built image
no longer fits what sandboxes expect of it (its products moved to `sandbox.docker`'s
`WORKSPACE_SEED`), so an image built before is never taken for one of the new kind."""

MAX_INPUT_BYTES = 8_000_000
"""A dependency file larger than this is refused: the key reads every one in full."""

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
"""Environment variable names a spec may not set: they would reach the agent phase."""

Language = Literal["python", "node"]


class Limits(BaseModel):
    """Resources the repository's sandboxes get instead of the defaults (None: the default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int | None = Field(None, ge=64, le=65_536)
    cpus: float | None = Field(None, gt=0, le=64)
    pids_limit: int | None = Field(None, ge=8, le=65_536)
    tmp_size_mb: int | None = Field(None, ge=1, le=65_536)


class EnvironmentSpec(BaseModel):
    """How to build a repository's environment and run its tests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["file", "detected"] = "detected"
    """Read from `SPEC_FILE` (or `--env FILE`), or detected from the repository's files."""
    languages: tuple[Language, ...] = ()
    """What was found to install for (informative: `setup` says what is done)."""
    packages: tuple[str, ...] = ()
    """Debian packages installed first, with `apt-get`."""
    setup: tuple[str, ...] = ()
    """Shell commands run in order in the build container, at the repository's root, with
    network access to the package registries and no secret."""
    build: tuple[str, ...] = ()
    """Shell commands that rebuild what the setup built in the tree (compiled modules, generated
    files: `python setup.py build_ext --inplace`, `make`, `npm run build`), run in the sandbox,
    offline, before tests whenever the working tree differs from the tree the image was built
    from in a file `build_inputs` names; a failing one is a tool error the model sees."""
    build_inputs: tuple[str, ...] = ()
    """Git pathspecs (`*.c`, `src/**/*.pyx`) of the files a change to which needs `build`; empty:
    every file."""
    test: str | None = None
    """The repository's test command; None: it has none Baton could find."""
    env: Mapping[str, str] = Field(default_factory=dict)
    """Environment variables of the build and of every sandbox; never secrets."""
    limits: Limits = Limits()
    inputs: tuple[str, ...] = ()
    """The files (paths from the root, or globs) whose contents key the environment: the
    dependency files the spec was read from, and any more a spec file lists."""

    @field_validator("packages")
    @classmethod
    def _debian_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.\-]+(=[A-Za-z0-9.+~:\-]+)?", name):
                raise ValueError(f"{name!r} is not a Debian package name")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if SECRET_NAME.search(name):
                raise ValueError(
                    f"{name} looks like a secret; an environment's variables reach every "
                    "sandbox, so secrets may not be set here"
                )
        return dict(value)

    @field_validator("inputs", "build_inputs")
    @classmethod
    def _inside(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if pattern.startswith("/") or ".." in Path(pattern).parts:
                raise ValueError(f"input {pattern!r} must be a path inside the repository")
        return value


def load(path: Path, *, root: Path | None = None) -> EnvironmentSpec:
    """The spec in a TOML file (`SPEC_FILE` in a repository, or `--env FILE`).

    Raises:
        EnvironmentSpecError: the file is not TOML or not a valid spec; the message names it
            (from the repository's root, for a file in `root`: the checkout may be temporary).
    """
    own = None
    if root is not None and path.resolve().is_relative_to(root.resolve()):
        own = path.resolve().relative_to(root.resolve()).as_posix()
    named = own or str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EnvironmentSpecError(f"{named}: not a readable TOML file: {exc}") from exc
    if own is not None:
        inputs = data.get("inputs", [])
        data["inputs"] = [own, *(inputs if isinstance(inputs, list) else [inputs])]
    return from_table(data, origin=named)


def from_table(data: Mapping[str, Any], *, origin: str) -> EnvironmentSpec:
    """The spec in a TOML table read from `origin`: a spec file, or the file `baton enqueue
    --env` read, which the run carries as a table (the orchestrator reaches this function
    through the entry point `baton.checks:environment`, to refuse a bad one before a run exists).

    Raises:
        EnvironmentSpecError: the table is not a valid spec; the message names `origin` and
            each field that is wrong.
    """
    if "test" in data and not isinstance(data["test"], str):
        raise EnvironmentSpecError(f"{origin}: test must be one command (a string)")
    if "source" in data:
        raise EnvironmentSpecError(f"{origin}: source: Baton sets it; a spec may not")
    try:
        return EnvironmentSpec.model_validate({**data, "source": "file"})
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(str(p) for p in error["loc"])
            + ": "
            + error["msg"].removeprefix("Value error, ")
            for error in exc.errors()
        )
        raise EnvironmentSpecError(f"{origin}: {problems}") from exc


LISTED_FIELDS = ("languages", "packages", "setup", "build", "build_inputs", "inputs")
"""The list fields `to_toml` writes, in the order a person reads them."""


def to_toml(spec: EnvironmentSpec, comments: Iterable[str] = ()) -> str:
    """`spec` as the TOML of a spec file (`load` reads it back to the same spec, but for
    `source`), after `comments` as `#` lines: what `baton env detect` prints for a person to
    save as `SPEC_FILE` and edit."""
    lines = [f"# {' '.join(comment.split())}" for comment in comments]
    for name in LISTED_FIELDS:
        values: tuple[str, ...] = getattr(spec, name)
        if len(values) > 1:
            lines += [f"{name} = [", *(f"    {_toml_string(v)}," for v in values), "]"]
        elif values:
            lines.append(f"{name} = [{_toml_string(values[0])}]")
    if spec.test is not None:
        lines.append(f"test = {_toml_string(spec.test)}")
    if spec.env:
        lines += ["", "[env]", *(f"{k} = {_toml_string(v)}" for k, v in spec.env.items())]
    limits = spec.limits.model_dump(exclude_none=True)
    if limits:
        lines += ["", "[limits]", *(f"{k} = {v}" for k, v in limits.items())]
    return "\n".join(lines) + "\n"


def _toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped."""
    return json.dumps(value).replace("\x7f", "\\u007f")


def detect(root: Path, *, version: str | None = None) -> EnvironmentSpec:
    """The repository's spec: its `SPEC_FILE` if it has one, else what its files say
    (`version`: the release its repository's tags say the tree is, `sandbox.detection`).

    Raises:
        EnvironmentSpecError: the repository's spec file is not valid.
    """
    own = root / SPEC_FILE
    if own.is_file():
        return load(own, root=root)
    from sandbox.detection import detection  # it builds on this module's spec

    return detection(root, version=version).spec


def environment_key(
    spec: EnvironmentSpec, root: Path, base_image_id: str, *, repository: str
) -> str:
    """The environment's key: a hash of the base image, the repository (any string that names
    it the same way every time), the spec and its inputs' contents.

    Raises:
        EnvironmentSpecError: an input file is larger than `MAX_INPUT_BYTES`.
    """
    digest = hashlib.sha256()
    digest.update(KEY_FORMAT.encode() + b"\0")
    digest.update(base_image_id.encode())
    digest.update(b"\0" + repository.encode() + b"\0")
    digest.update(spec.model_dump_json(exclude={"source"}).encode())
    for relative in input_files(spec, root):
        path = root / relative
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise EnvironmentSpecError(
                f"{relative} is {path.stat().st_size} bytes; a dependency file may be at most "
                f"{MAX_INPUT_BYTES}"
            )
        digest.update(b"\0" + relative.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:KEY_CHARS]


def input_files(spec: EnvironmentSpec, root: Path) -> list[str]:
    """The files the spec's inputs name that exist, as sorted paths from the root (a symlink
    out of the repository is not followed)."""
    found: set[str] = set()
    top = root.resolve()
    for pattern in spec.inputs:
        for path in root.glob(pattern):
            if path.is_file() and path.resolve().is_relative_to(top):
                found.add(path.relative_to(root).as_posix())
    return sorted(found)
