"""Which of a Python repository's declared dependency sets its tests need.

A project declares sets in several places: PEP 735 `[dependency-groups]`, extras
(`[project.optional-dependencies]`, setup.cfg's `extras_require`, a literal `extras_require` in
setup.py), requirements files (`requirements/tests.txt`, `requirements-test.txt`,
`test-requirements.txt`), tox's test environment (`deps`, `extras`; in tox.ini, pyproject's
`[tool.tox] legacy_tox_ini`, or tox 4's TOML) and nox sessions (the string literals a test
session passes to `session.install`, read with `ast`: the noxfile is never run). The first of
those sources, in that order, that has a set named like tests (`test`, `tests`, `testing`,
`test-*`) is the one installed; a development set (`dev`…) only when there is no test set; docs,
lint and typing sets never.

    chosen = test_set(root, pyproject, setup_cfg, tox)
    chosen.origin, chosen.requirements, chosen.files, chosen.extras

Pure: reads files, runs nothing.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_NAME = re.compile(r"(test|tests|testing)([-_.].*)?", re.IGNORECASE)
"""A set named for the tests: `test`, `tests`, `testing`, `tests-extra`, `test_unit`."""
EXACT_TEST = ("test", "tests", "testing")
"""Preferred over the prefixed names when both exist (`tests` over `tests-mypy`)."""
DEV_NAME = re.compile(r"dev|develop|development", re.IGNORECASE)
"""A development set: installed only when the project declares no test set."""

REQUIREMENTS_FILE = re.compile(
    r"requirements/(?P<a>[^/]+)\.txt|requirements[-_](?P<b>[^/]+)\.txt|(?P<c>[^/]+)[-_]requirements\.txt"
)
"""A requirements file named for a set; the name is the part that is not `requirements`."""
MAX_NOXFILE_BYTES = 200_000
"""Most bytes of a noxfile, setup.py or tox.toml parsed (a larger one is read as none)."""


@dataclass(frozen=True)
class TestSet:
    """The dependencies the tests need, as one source declares them."""

    origin: str
    """Where it was read, for a person: `requirements/tests.txt`, `[dependency-groups] tests`."""
    requirements: tuple[str, ...] = ()
    """Requirement specifiers to install (`pytest>=8`)."""
    files: tuple[str, ...] = ()
    """Requirements files (paths from the root) to install with `pip install -r`."""
    extras: tuple[str, ...] = ()
    """Extras of the project itself (`.[tests]`)."""
    fallback: bool = False
    """A development set, used because the project declares no test set."""
    left_out: tuple[str, ...] = field(default=())
    """The other sets found and not installed (for the reason a person reads)."""


def test_set(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    tox: configparser.ConfigParser,
) -> TestSet | None:
    """The set the tests need: the first source's test set, else its development set, else
    None (the project declares neither)."""
    sources = list(_sources(root, pyproject, setup_cfg, tox))
    every = [found.origin for sets in sources for found in sets.values()]
    for wanted, fallback in ((TEST_NAME, False), (DEV_NAME, True)):
        for sets in sources:
            names = [n for n in sets if wanted.fullmatch(n)]
            exact = [n for n in names if n.lower() in EXACT_TEST]
            if names:
                chosen = (exact or names)[:1] if fallback else (exact or names)
                found = _merged([sets[n] for n in chosen])
                kept = {sets[n].origin for n in chosen}
                left = tuple(dict.fromkeys(o for o in every if o not in kept))
                return TestSet(
                    found.origin, found.requirements, found.files, found.extras, fallback, left
                )
    return None


def requirement_set_name(path: str) -> str | None:
    """The set a requirements file is named for (`requirements/tests.txt` → `tests`), or None
    for a plain `requirements.txt` (the project's own dependencies)."""
    match = REQUIREMENTS_FILE.fullmatch(path)
    return next((g for g in match.groups() if g), None) if match else None


# -- sources -----------------------------------------------------------------------------------


Sets = dict[str, TestSet]


def _sources(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    tox: configparser.ConfigParser,
) -> Iterator[Sets]:
    """Each source's sets by name, in the order they are preferred."""
    groups = _dependency_groups(pyproject)
    yield {n: TestSet(f"group {n}", requirements=tuple(r)) for n, r in groups.items()}
    yield {n: TestSet(f"extra {n}", extras=(n,)) for n in _extras(root, pyproject, setup_cfg)}
    files: Sets = {}
    for path in _requirement_files(root):
        name = requirement_set_name(path)
        if name is not None:
            files.setdefault(name, TestSet(path, files=(path,)))
    yield files
    yield _tox_sets(root, pyproject, tox)
    yield _nox_sets(root)


def _merged(sets: list[TestSet]) -> TestSet:
    """One set of all of `sets`, named for each of them (`extra test, extra testing`)."""
    return TestSet(
        ", ".join(s.origin for s in sets),
        requirements=tuple(dict.fromkeys(r for s in sets for r in s.requirements)),
        files=tuple(dict.fromkeys(f for s in sets for f in s.files)),
        extras=tuple(dict.fromkeys(e for s in sets for e in s.extras)),
    )


def _requirement_files(root: Path) -> list[str]:
    found = {
        path.relative_to(root).as_posix()
        for pattern in ("requirements[-_]*.txt", "*[-_]requirements.txt", "requirements/*.txt")
        for path in root.glob(pattern)
        if path.is_file() and not path.is_symlink()
    }
    return sorted(found)


def _dependency_groups(pyproject: Mapping[str, Any]) -> dict[str, list[str]]:
    """PEP 735 groups, with `{include-group = …}` entries expanded."""
    raw = pyproject.get("dependency-groups") or {}
    if not isinstance(raw, dict):
        return {}

    def expand(name: str, seen: frozenset[str]) -> list[str]:
        out: list[str] = []
        for item in raw.get(name) or []:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and item.get("include-group") not in seen:
                included = str(item.get("include-group"))
                out += expand(included, seen | {included})
        return out

    return {str(name): expand(name, frozenset({name})) for name in raw}


def _extras(
    root: Path, pyproject: Mapping[str, Any], setup_cfg: configparser.ConfigParser
) -> list[str]:
    project = pyproject.get("project") or {}
    names = list((project.get("optional-dependencies") or {}) if isinstance(project, dict) else {})
    if setup_cfg.has_section("options.extras_require"):
        names += setup_cfg.options("options.extras_require")
    names += _setup_py_extras(root / "setup.py")
    return list(dict.fromkeys(str(n) for n in names))


def _setup_py_extras(path: Path) -> list[str]:
    """The keys of a literal `extras_require={…}` in setup.py (read with `ast`, never run)."""
    tree = _parsed(path)
    if tree is None:
        return []
    return [
        key.value
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg == "extras_require"
        and isinstance(node.value, ast.Dict)
        for key in node.value.keys
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    ]  # fmt: skip


# -- tox ---------------------------------------------------------------------------------------


def _tox_sets(root: Path, pyproject: Mapping[str, Any], tox: configparser.ConfigParser) -> Sets:
    """tox's test environment (the base every `py3x` environment extends), as the set `tests`."""
    found = _tox_base(root, pyproject, tox)
    if found is None:
        return {}
    origin, lines, extras = found
    words = _install_arguments(root, [w for line in lines for w in _tox_words(line)])
    named = [e for e in extras if re.fullmatch(r"[\w.-]+", e)]
    chosen = TestSet(
        origin, words.requirements, words.files, tuple(dict.fromkeys([*words.extras, *named]))
    )
    return {"tests": chosen} if chosen.requirements or chosen.files or chosen.extras else {}


def _tox_base(
    root: Path, pyproject: Mapping[str, Any], tox: configparser.ConfigParser
) -> tuple[str, list[str], list[str]] | None:
    """Where tox's base environment is declared, its `deps` lines and its `extras`: tox.ini's
    `[testenv]`, pyproject's `[tool.tox] legacy_tox_ini` (the same INI in a string), or tox 4's
    TOML (`env_run_base` in tox.toml, or `[tool.tox.env_run_base]` in pyproject)."""
    table = (pyproject.get("tool") or {}).get("tox") or {}
    config = tox
    if not config.sections() and isinstance(table.get("legacy_tox_ini"), str):
        config = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            config.read_string(table["legacy_tox_ini"], source="pyproject.toml [tool.tox]")
        except configparser.Error:
            return None
    if config.has_section("testenv"):
        extras = re.split(r"[\s,]+", config.get("testenv", "extras", fallback="").strip())
        return "tox [testenv]", config.get("testenv", "deps", fallback="").splitlines(), extras
    base = table.get("env_run_base") or _toml_table(root / "tox.toml").get("env_run_base")
    if not isinstance(base, dict):
        return None
    strings = [[v for v in base.get(key) or [] if isinstance(v, str)] for key in ("deps", "extras")]
    return "tox env_run_base", strings[0], strings[1]


def _toml_table(path: Path) -> dict[str, Any]:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_NOXFILE_BYTES:
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _tox_words(line: str) -> list[str]:
    """One `deps` line as pip arguments; a line for some factors only (`py38: mock`) or one
    tox still has to substitute (`{[base]deps}`) is left out."""
    line = line.split(" #")[0].strip().replace("{toxinidir}/", "").replace("{toxinidir}", ".")
    if not line or line.startswith("#") or re.match(r"^[\w,!.-]+\s*:", line) or "{" in line:
        return []
    if line.startswith(("-r", "-c", "-e")) and len(line) > 2 and line[2] != " ":
        return [line[:2], line[2:].strip()]
    return line.split(maxsplit=1) if line.startswith("-") else [line]


# -- nox ---------------------------------------------------------------------------------------


def _nox_sets(root: Path) -> Sets:
    """The string literals each test-named session of noxfile.py passes to
    `session.install` (a module-level list or tuple of strings, starred, counts too)."""
    tree = _parsed(root / "noxfile.py")
    if tree is None:
        return {}
    constants = _string_lists(tree)
    sets: Sets = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        name = _session_name(node)
        if name is None:
            continue
        words: list[str] = []
        for call in ast.walk(node):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "install"
            ):
                words += _literal_words(call.args, constants)
        found = _install_arguments(root, words)
        if found.requirements or found.files or found.extras:
            sets[name] = TestSet(
                f"nox session {name}", found.requirements, found.files, found.extras
            )
    return sets


def _string_lists(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level names bound to a literal list or tuple: their string items."""
    constants: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, (ast.List, ast.Tuple)):
                strings = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                constants[target.id] = [s for s in strings if isinstance(s, str)]
    return constants


def _session_name(function: ast.FunctionDef) -> str | None:
    """The session's name if `function` is decorated as a nox session: `name=` or its own."""
    for decorator in function.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call else decorator
        named = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if named == "session":
            for keyword in call.keywords if call else []:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
            return function.name
    return None


def _literal_words(args: list[ast.expr], constants: Mapping[str, list[str]]) -> list[str]:
    words: list[str] = []
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            words.append(arg.value)
        elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
            words += constants.get(arg.value.id, [])
    return words


# -- pip arguments -----------------------------------------------------------------------------


def _install_arguments(root: Path, words: list[str]) -> TestSet:
    """`pip install` arguments as a set: `-r FILE` (a file inside the repository), the project
    itself with extras (`.`, `-e .[test]`), and requirement specifiers; other options (an
    index URL, constraints) are dropped: only what the project's own files name is installed."""
    requirements: list[str] = []
    files: list[str] = []
    extras: list[str] = []
    skip_next = False
    for index, word in enumerate(words):
        if skip_next:
            skip_next = False
            continue
        if word in ("-r", "--requirement") and index + 1 < len(words):
            path = words[index + 1].removeprefix("./")
            if _inside(root, path):
                files.append(path)
            skip_next = True
        elif word in ("-e", "--editable"):
            continue
        elif word.startswith("-"):
            skip_next = word in ("-c", "--constraint", "-i", "--index-url", "--extra-index-url")
        elif match := re.fullmatch(r"\.(?:\[([\w,.\s-]*)\])?", word):
            extras += [e.strip() for e in (match.group(1) or "").split(",") if e.strip()]
        elif re.match(r"[A-Za-z0-9]", word) and not word.startswith(("http:", "https:", "git+")):
            requirements.append(word)
    return TestSet("", tuple(requirements), tuple(files), tuple(extras))


def _inside(root: Path, path: str) -> bool:
    if path.startswith("/") or ".." in Path(path).parts:
        return False
    full = root / path
    return full.is_file() and not full.is_symlink()


def _parsed(path: Path) -> ast.Module | None:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_NOXFILE_BYTES:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None  # a file nested deeper than the parser goes is read as no file
