"""The environment a repository implies when it states none: what its files say it needs to
build and to run its tests, and why each choice was made (`baton env detect` prints the
reasons as comments).

Python (`pyproject.toml`, `setup.py`/`setup.cfg`, `requirements.txt`): a venv, the project's
test dependency set (`sandbox.testdeps`), its native build (`sandbox.native`) and the project
installed editable. Node (`package.json`): `npm ci` with a lockfile, and `npm run build` when it
has a build script. Nothing else is installed.

    found = detection(Path("/srv/checkout"))
    found.spec, found.reasons

Pure: reads files, runs nothing. `sandbox.environment.detect` is the entry point most callers
want (it also reads the repository's own spec file).
"""

from __future__ import annotations

import configparser
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.environment import BASE_PATH, VENV, EnvironmentSpec, Language
from sandbox.errors import EnvironmentSpecError
from sandbox.native import KNOWN_KINDS, NativeBuild, node_build, python_build
from sandbox.testdeps import TestSet, test_set
from sandbox.testrunner import SCANNED_BYTES, declares_pytest, test_command, test_files, test_runner

NODE_LOCKFILES = ("package-lock.json", "npm-shrinkwrap.json")
"""Lockfiles `npm ci` installs from exactly."""
NPM_PLACEHOLDER_TEST = 'echo "Error: no test specified" && exit 1'
JEST = re.compile(r"(^|[\s/])jest(\s|$)")
"""A test script that runs jest (`jest`, `node_modules/.bin/jest …`)."""
CHAINED = re.compile(r"&&|\|\||;|\|")
"""A script of several commands: arguments after `--` would reach only the last."""
"""The `test` script `npm init` writes: not a test command."""

GIT_HOOKS = re.compile(r"\b(husky|lefthook|simple-git-hooks|pre-commit|git rev-parse)\b")
"""A lifecycle script that installs git hooks: it fails in the build container, whose tree has
no `.git`, so the package's own install scripts are skipped there."""
SCM_VERSIONING = re.compile(r"setuptools[-_]scm|hatch[-_]vcs|flit[-_]scm", re.IGNORECASE)
"""Build requirements that read the version from git, which the build container does not have
(it gets the tree without `.git`)."""
SCM_VERSION_VARIABLE = "SETUPTOOLS_SCM_PRETEND_VERSION"
"""setuptools-scm's override of the version it would read from git (hatch-vcs and flit-scm
use setuptools-scm, so it serves them too)."""
UNKNOWN_VERSION = "0.0.0"
"""The version given when the tree has no PKG-INFO saying its own."""
PYTHON_INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "tox.toml", "noxfile.py")
"""Files whose contents key a Python environment, when the repository has them."""


@dataclass(frozen=True)
class Detection:
    """A detected spec and why: one line per choice, each starting with the field it set."""

    spec: EnvironmentSpec
    reasons: tuple[str, ...]


@dataclass
class _Part:
    language: Language
    setup: list[str]
    test: str | None
    inputs: list[str]
    packages: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    build_inputs: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    reasons: tuple[str, ...] = ()


def detection(root: Path, *, version: str | None = None) -> Detection:
    """What `root`'s files imply (its own spec file is not read here); `version`: the release
    the tree is, from its repository's tags (`RepoCache.version`), for a build that would read
    it from git.

    Raises:
        EnvironmentSpecError: a manifest (pyproject.toml, package.json, …) does not parse.
    """
    found = [part for part in (_python(root, version), _node(root)) if part is not None]
    env: dict[str, str] = {}
    for part in found:
        env.update(part.env or {})
    spec = EnvironmentSpec(
        languages=tuple(part.language for part in found),
        packages=tuple(dict.fromkeys(p for part in found for p in part.packages)),
        setup=tuple(command for part in found for command in part.setup),
        build=tuple(command for part in found for command in part.build),
        build_inputs=tuple(dict.fromkeys(i for part in found for i in part.build_inputs)),
        test=next((part.test for part in found if part.test), None),
        env=env,
        inputs=tuple(sorted({path for part in found for path in part.inputs})),
    )
    reasons = tuple(reason for part in found for reason in part.reasons)
    return Detection(spec, reasons or ("nothing to install: no Python or Node project found",))


def _python(root: Path, version: str | None) -> _Part | None:
    pyproject = _toml(root / "pyproject.toml")
    setup_cfg = _ini(root / "setup.cfg")
    tox = _ini(root / "tox.ini")
    installable = (root / "setup.py").is_file() or bool(
        pyproject.get("project") or pyproject.get("build-system")
    )
    base = ["requirements.txt"] if (root / "requirements.txt").is_file() else []
    chosen = test_set(root, pyproject, setup_cfg, tox)
    has_python = installable or base or chosen or any(root.glob("*.py")) or test_files(root)
    if not has_python:
        return None
    native = python_build(root, pyproject) if installable else None
    files = [*base, *(chosen.files if chosen else ())]
    extras = [*(chosen.extras if chosen else ())] if installable else []
    requirements = [*(chosen.requirements if chosen else ())]
    setup = [f"python3 -m venv {VENV}", "python -m pip install --upgrade pip setuptools wheel"]
    setup += [f"python -m pip install -r {_quote(path)}" for path in files]
    build_requires = _build_requires(pyproject, root) if native and native.in_venv else []
    if build_requires:
        setup.append("python -m pip install " + " ".join(_quote(r) for r in build_requires))
    if installable:
        target = f".[{','.join(extras)}]" if extras else "."
        isolation = "--no-build-isolation " if native and native.in_venv else ""
        setup.append(f"python -m pip install {isolation}-e {_quote(target)}")
    declared = declares_pytest(root, pyproject, setup_cfg, chosen, files)
    runner = test_runner(root, pyproject, setup_cfg, tox, declared=declared)
    missing = ["pytest"] if runner == "pytest" and not declared else []
    if requirements or missing:
        wanted = list(dict.fromkeys([*requirements, *missing]))
        setup.append("python -m pip install " + " ".join(_quote(r) for r in wanted))
    if not installable and not files and not requirements and not missing:
        setup = []  # the standard library is all it needs
    env = {"VIRTUAL_ENV": VENV, "PATH": f"{VENV}/bin:{BASE_PATH}", "PIP_NO_INPUT": "1"}
    reasons = [_test_reason(chosen, base, missing)]
    scm = _scm_version(root, pyproject, version)
    if scm is not None:
        env[SCM_VERSION_VARIABLE] = scm
        reasons.append(
            f"env: {SCM_VERSION_VARIABLE}={scm}: the build reads its version from git "
            "(setuptools-scm), and the build container's tree has no .git"
        )
    reasons += _native_reasons(native, build_requires)
    test = test_command(root, runner)
    reasons.append(f"test: {test or 'none found'} ({runner or 'no test files'})")
    inputs = [name for name in PYTHON_INPUTS if (root / name).is_file()] + files
    if native is None:
        return _Part("python", setup, test, inputs, env=env, reasons=tuple(reasons))
    return _Part(
        "python", setup, test, inputs, packages=native.packages, build=native.build,
        build_inputs=native.build_inputs, env=env, reasons=tuple(reasons),
    )  # fmt: skip


def _node(root: Path) -> _Part | None:
    manifest_path = root / "package.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EnvironmentSpecError(f"package.json: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise EnvironmentSpecError("package.json: not a JSON object")
    lockfiles = [name for name in NODE_LOCKFILES if (root / name).is_file()]
    install = "npm ci --no-audit --no-fund" if lockfiles else "npm install --no-audit --no-fund"
    scripts = manifest.get("scripts")
    scripts = scripts if isinstance(scripts, dict) else {}
    hooks = [n for n in ("prepare", "postinstall") if GIT_HOOKS.search(str(scripts.get(n, "")))]
    if hooks:  # the tree has no .git: its own scripts are skipped, its dependencies' are run
        install = f"{install} --ignore-scripts && npm rebuild"
    script = scripts.get("test")
    test = (
        "npm test" if isinstance(script, str) and script.strip() != NPM_PLACEHOLDER_TEST else None
    )
    if test and JEST.search(str(script)) and not CHAINED.search(str(script)):
        test = "npm test -- --verbose"  # jest names each test only when verbose
    builds = isinstance(scripts.get("build"), str)
    build = ("npm run build",) if builds else ()
    native = node_build(root, manifest)
    reasons = [
        f"setup: {install.split(' --')[0]}"
        + (f" ({lockfiles[0]})" if lockfiles else " (no lockfile: versions may drift)")
        + (f"; its own {hooks[0]} script installs git hooks and is skipped (the build "
           "container's tree has no .git), its dependencies' scripts run (npm rebuild)"
           if hooks else ""),
        "build: npm run build (package.json has a build script; every file is its input)"
        if builds else "build: none (package.json has no build script)",
        f"test: {test or 'none found'} (package.json scripts.test"
        + (", which runs jest: --verbose names each test)" if "verbose" in (test or "") else ")"),
    ]  # fmt: skip
    if native is not None:
        reasons.insert(0, f"packages: {', '.join(native.packages)}: {native.reason}")
    return _Part(
        "node", [install, *build], test, ["package.json", *lockfiles],
        packages=native.packages if native else (), build=build, reasons=tuple(reasons),
    )  # fmt: skip


def _test_reason(chosen: TestSet | None, base: list[str], missing: list[str]) -> str:
    said = "test deps: "
    if chosen is None:
        said += "none declared"
    else:
        said += chosen.origin + (" (dev set: no test set declared" if chosen.fallback else
                                 " (test set")  # fmt: skip
        said += f"; {', '.join(chosen.left_out)} left out)" if chosen.left_out else ")"
    if base:
        said += "; requirements.txt (the project's own dependencies)"
    if missing:
        said += "; pytest added (the tests use it and no set declares it)"
    return said


def _native_reasons(native: NativeBuild | None, build_requires: list[str]) -> list[str]:
    if native is None:
        return ["packages: none (no native code found)"]
    said = [f"packages: {', '.join(native.packages)}: {native.reason}"]
    if build_requires:
        said.append(
            f"setup: build requirements {', '.join(build_requires)} installed into the venv and "
            "the project with --no-build-isolation, so the offline rebuild finds them"
        )
    if native.build:
        said.append(f"build: {native.build[0]} ({native.kind} extensions, rebuilt in the tree)")
    elif native.kind == "meson-python":
        said.append("build: none (meson-python's editable install rebuilds on import)")
    elif native.kind not in KNOWN_KINDS:
        said.append(f"build: none ({native.kind}: Baton does not know its rebuild; the setup "
                    "builds it once)")  # fmt: skip
    else:
        said.append(
            f"build: none ({native.kind} rebuilds by reinstalling into the venv, read-only in "
            "the sandbox; the setup builds it once)"
        )
    return said


def _build_requires(pyproject: Mapping[str, Any], root: Path) -> list[str]:
    """`[build-system] requires` (or setuptools, wheel and Cython for a setup.py that imports
    Cython and declares no build system); never a pip option."""
    system = pyproject.get("build-system") or {}
    requires = [str(r) for r in system.get("requires") or [] if isinstance(r, str)]
    if not system:
        requires = ["setuptools", "wheel"]
        setup_py = root / "setup.py"
        head = setup_py.read_bytes()[:SCANNED_BYTES] if setup_py.is_file() else b""
        requires += ["Cython"] if re.search(rb"(from|import)\s+Cython", head) else []
    return [r for r in requires if re.match(r"[A-Za-z0-9]", r)]


def _scm_version(root: Path, pyproject: Mapping[str, Any], version: str | None) -> str | None:
    """The version to give setuptools-scm when the build names it: the tree's PKG-INFO's (an
    sdist's), else `version` (its repository's tag), else `UNKNOWN_VERSION` (which a test
    dependency that needs the project itself, a pytest plugin's pytest, cannot accept)."""
    system = pyproject.get("build-system") or {}
    requires = " ".join(str(r) for r in system.get("requires") or [])
    setup_py = root / "setup.py"
    in_setup = setup_py.is_file() and b"use_scm_version" in setup_py.read_bytes()[:SCANNED_BYTES]
    if not (SCM_VERSIONING.search(requires) or in_setup):
        return None
    info = root / "PKG-INFO"
    readable = info.is_file() and not info.is_symlink()
    text = info.read_bytes()[:SCANNED_BYTES].decode("utf-8", "replace") if readable else ""
    match = re.search(r"^Version:\s*([A-Za-z0-9.+!_-]+)\s*$", text, re.MULTILINE)
    return match.group(1) if match else version or UNKNOWN_VERSION


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


def _quote(argument: str) -> str:
    """One shell word (the setup commands run through `sh -c`)."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./\-]+", argument):
        return argument
    return "'" + argument.replace("'", "'\"'\"'") + "'"
