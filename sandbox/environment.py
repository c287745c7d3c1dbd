"""What a repository needs before its tests can run: its environment spec, and the key of the
image built from it.

A repository says it in `.baton/environment.toml`; otherwise the spec is detected from what the
repository holds: Python (`pyproject.toml`, `setup.py`/`setup.cfg`, `requirements*.txt`, test
extras and dependency groups, `tox.ini`), Node (`package.json`, with `npm ci` when it has a
lockfile), or nothing to install. The key hashes the base image, the repository, the spec and
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

import configparser
import hashlib
import json
import os
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

MAX_INPUT_BYTES = 8_000_000
"""A dependency file larger than this is refused: the key reads every one in full."""

TEST_EXTRAS = ("test", "tests", "testing")
"""Optional-dependency extras and dependency groups that hold what the tests need."""
DEV_EXTRAS = ("dev", "develop", "development")
"""Used when there is no test extra: a development extra usually holds the test runner."""

REQUIREMENTS_GLOBS = (
    "requirements.txt",
    "requirements-*.txt",
    "requirements_*.txt",
    "*-requirements.txt",
    "*_requirements.txt",
    "requirements/*.txt",
)
"""Requirements files installed for the tests (those named for docs or linting are left out:
`SKIPPED_REQUIREMENTS`)."""
SKIPPED_REQUIREMENTS = re.compile(r"doc|lint|typ|mypy|release|publish|bench", re.IGNORECASE)

MAX_SCANNED = 200
"""Most test files read to tell pytest from unittest."""
SCANNED_BYTES = 20_000
PRUNED = frozenset(
    {"node_modules", "venv", "env", "site-packages", "build", "dist", "__pycache__", "docs"}
)
"""Folders that hold no test of the repository's own."""

NODE_LOCKFILES = ("package-lock.json", "npm-shrinkwrap.json")
"""Lockfiles `npm ci` installs from exactly."""
NPM_PLACEHOLDER_TEST = 'echo "Error: no test specified" && exit 1'
"""The `test` script `npm init` writes: not a test command."""

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
        EnvironmentSpecError: the file is not TOML or not a valid spec; the message names it.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EnvironmentSpecError(f"{path}: not a readable TOML file: {exc}") from exc
    if root is not None and path.resolve().is_relative_to(root.resolve()):
        own = path.resolve().relative_to(root.resolve()).as_posix()
        inputs = data.get("inputs", [])
        data["inputs"] = [own, *(inputs if isinstance(inputs, list) else [inputs])]
    return from_table(data, origin=str(path))


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


def detect(root: Path) -> EnvironmentSpec:
    """The repository's spec: its `SPEC_FILE` if it has one, else what its files say.

    Raises:
        EnvironmentSpecError: the repository's spec file is not valid.
    """
    own = root / SPEC_FILE
    if own.is_file():
        return load(own, root=root)
    python, node = _python(root), _node(root)
    found = [part for part in (python, node) if part is not None]
    env: dict[str, str] = {}
    if python is not None:
        env = {"VIRTUAL_ENV": VENV, "PATH": f"{VENV}/bin:{BASE_PATH}", "PIP_NO_INPUT": "1"}
    return EnvironmentSpec(
        languages=tuple(part.language for part in found),
        setup=tuple(command for part in found for command in part.setup),
        test=next((part.test for part in found if part.test), None),
        env=env,
        inputs=tuple(sorted({path for part in found for path in part.inputs})),
    )


def environment_key(
    spec: EnvironmentSpec, root: Path, base_image_id: str, *, repository: str
) -> str:
    """The environment's key: a hash of the base image, the repository (any string that names
    it the same way every time), the spec and its inputs' contents.

    Raises:
        EnvironmentSpecError: an input file is larger than `MAX_INPUT_BYTES`.
    """
    digest = hashlib.sha256()
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


# -- detection ---------------------------------------------------------------------------------


class _Part(BaseModel):
    language: Language
    setup: list[str]
    test: str | None
    inputs: list[str]


def _python(root: Path) -> _Part | None:
    pyproject = _toml(root / "pyproject.toml")
    setup_cfg = _ini(root / "setup.cfg")
    tox = _ini(root / "tox.ini")
    installable = (root / "setup.py").is_file() or bool(
        pyproject.get("project") or pyproject.get("build-system")
    )
    requirements = _requirements_files(root)
    has_python = installable or requirements or any(root.glob("*.py")) or _test_files(root)
    if not has_python:
        return None
    inputs = [
        name
        for name in ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini")
        if (root / name).is_file()
    ] + requirements
    extras = _extras(pyproject, setup_cfg)
    wanted = [e for e in TEST_EXTRAS if e in extras] or [e for e in DEV_EXTRAS if e in extras][:1]
    groups = _dependency_groups(pyproject)
    group_names = [g for g in TEST_EXTRAS if g in groups] or [g for g in DEV_EXTRAS if g in groups][
        :1
    ]
    extra_requirements = [req for name in group_names for req in groups[name]]
    extra_requirements += _tox_deps(tox)
    setup = [f"python3 -m venv {VENV}", "python -m pip install --upgrade pip setuptools wheel"]
    setup += [f"python -m pip install -r {_quote(path)}" for path in requirements]
    if installable:
        target = f".[{','.join(wanted)}]" if wanted else "."
        setup.append(f"python -m pip install -e {_quote(target)}")
    declared = _declares_pytest(root, pyproject, setup_cfg, extra_requirements, requirements)
    runner = _test_runner(root, pyproject, setup_cfg, tox, declared=declared)
    missing = ["pytest"] if runner == "pytest" and not declared else []
    if extra_requirements or missing:
        wanted_packages = list(dict.fromkeys([*extra_requirements, *missing]))
        setup.append("python -m pip install " + " ".join(_quote(r) for r in wanted_packages))
    if not installable and not requirements and not extra_requirements and not missing:
        setup = []  # the standard library is all it needs
    test = {"pytest": "python -m pytest", "unittest": _unittest_command(root), None: None}[runner]
    return _Part(language="python", setup=setup, test=test, inputs=inputs)


def _node(root: Path) -> _Part | None:
    manifest_path = root / "package.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EnvironmentSpecError(f"package.json: not valid JSON: {exc}") from exc
    lockfiles = [name for name in NODE_LOCKFILES if (root / name).is_file()]
    install = "npm ci --no-audit --no-fund" if lockfiles else "npm install --no-audit --no-fund"
    scripts = manifest.get("scripts") if isinstance(manifest, dict) else None
    script = scripts.get("test") if isinstance(scripts, dict) else None
    test = (
        "npm test" if isinstance(script, str) and script.strip() != NPM_PLACEHOLDER_TEST else None
    )
    return _Part(language="node", setup=[install], test=test, inputs=["package.json", *lockfiles])


def _toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EnvironmentSpecError(f"{path.name}: not valid TOML: {exc}") from exc


def _ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    if path.is_file():
        try:
            parser.read_string(path.read_text(encoding="utf-8"), source=path.name)
        except (UnicodeDecodeError, configparser.Error) as exc:
            raise EnvironmentSpecError(f"{path.name}: not a valid INI file: {exc}") from exc
    return parser


def _requirements_files(root: Path) -> list[str]:
    found: set[str] = set()
    for pattern in REQUIREMENTS_GLOBS:
        for path in root.glob(pattern):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not SKIPPED_REQUIREMENTS.search(relative):
                found.add(relative)
    return sorted(found)


def _extras(pyproject: Mapping[str, Any], setup_cfg: configparser.ConfigParser) -> set[str]:
    extras = set((pyproject.get("project") or {}).get("optional-dependencies") or {})
    if setup_cfg.has_section("options.extras_require"):
        extras |= set(setup_cfg.options("options.extras_require"))
    return extras


def _dependency_groups(pyproject: Mapping[str, Any]) -> dict[str, list[str]]:
    """PEP 735 groups, with `{include-group = …}` entries expanded."""
    raw = pyproject.get("dependency-groups") or {}

    def expand(name: str, seen: frozenset[str]) -> list[str]:
        out: list[str] = []
        for item in raw.get(name) or []:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and item.get("include-group") not in seen:
                included = str(item.get("include-group"))
                out += expand(included, seen | {included})
        return out

    return {name: expand(name, frozenset({name})) for name in raw}


def _tox_deps(tox: configparser.ConfigParser) -> list[str]:
    """The plain requirements of tox's `[testenv] deps` (no `-r` lines, no factors)."""
    if not tox.has_option("testenv", "deps"):
        return []
    lines = (line.strip() for line in tox.get("testenv", "deps").splitlines())
    return [
        line
        for line in lines
        if line and not line.startswith(("-", "#")) and "{" not in line and ":" not in line
    ]


def _declares_pytest(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    requirements: Iterable[str],
    requirement_files: Iterable[str],
) -> bool:
    """pytest is among what the setup installs (a requirements file, an extra, a group)."""
    texts = [*requirements]
    texts += [
        (root / path).read_text(encoding="utf-8", errors="replace") for path in requirement_files
    ]
    project = pyproject.get("project") or {}
    for extra in (project.get("optional-dependencies") or {}).values():
        texts += [str(req) for req in extra]
    if setup_cfg.has_section("options.extras_require"):
        texts += [
            setup_cfg.get("options.extras_require", name)
            for name in setup_cfg.options("options.extras_require")
        ]
    return any(re.search(r"(^|[\s\"'\[,])pytest\b", text.lower()) for text in texts)


def _test_runner(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    tox: configparser.ConfigParser,
    *,
    declared: bool,
) -> Literal["pytest", "unittest"] | None:
    """pytest where the repository configures or uses it, or has plain test functions;
    unittest where every test file imports it and nothing asks for pytest; None: no tests."""
    configured = (
        any((root / name).is_file() for name in ("pytest.ini", "conftest.py", "tests/conftest.py"))
        or "pytest" in (pyproject.get("tool") or {})
        or setup_cfg.has_section("tool:pytest")
        or tox.has_section("pytest")
    )
    files = _test_files(root)
    if configured or declared:
        return "pytest"
    if not files:
        return None
    heads = [path.read_bytes()[:SCANNED_BYTES].decode("utf-8", "replace") for path in files]
    if any("pytest" in head for head in heads):
        return "pytest"
    if all("unittest" in head for head in heads):
        return "unittest"
    return "pytest"


def _test_files(root: Path) -> list[Path]:
    """Python test files (`test_*.py`, `*_test.py`), at most `MAX_SCANNED`, outside hidden
    folders, virtualenvs and installed packages."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in PRUNED)
        found += [
            Path(folder, name)
            for name in sorted(files)
            if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
        ]
        if len(found) >= MAX_SCANNED:
            return found[:MAX_SCANNED]
    return found


def _unittest_command(root: Path) -> str:
    if (root / "tests" / "__init__.py").is_file():
        return "python3 -m unittest discover -s tests -t ."
    return "python3 -m unittest discover"


def _quote(argument: str) -> str:
    """One shell word (the setup commands run through `sh -c`)."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./\-]+", argument):
        return argument
    return "'" + argument.replace("'", "'\"'\"'") + "'"
