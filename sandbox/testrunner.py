"""Which runner a Python repository's tests use, and whether what the setup installs brings
pytest: pytest where the repository configures or uses it (or has plain test functions),
unittest where every test file imports only that.

Pure: reads files, runs nothing.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from sandbox.testdeps import TestSet

Runner = Literal["pytest", "unittest"]

MAX_SCANNED = 200
"""Most test files read to tell pytest from unittest."""
SCANNED_BYTES = 20_000
"""How much of a file is read for a sign (an import, a version)."""
PRUNED = frozenset(
    {"node_modules", "venv", "env", "site-packages", "build", "dist", "__pycache__", "docs"}
)
"""Folders that hold no test of the repository's own."""


def declares_pytest(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    chosen: TestSet | None,
    files: list[str],
) -> bool:
    """pytest is among what the setup installs (a requirements file, an extra, a group)."""
    texts = [*(chosen.requirements if chosen else ())]
    texts += [(root / path).read_text(encoding="utf-8", errors="replace") for path in files]
    project = pyproject.get("project") or {}
    extras = project.get("optional-dependencies") or {}
    named = list(chosen.extras if chosen else ())
    for name in named:  # grows with the project's own extras an extra names (`x[test-core]`)
        listed = [str(req) for req in extras.get(name) or []]
        if setup_cfg.has_option("options.extras_require", name):
            listed.append(setup_cfg.get("options.extras_require", name))
        texts += listed
        own = rf"^{re.escape(str(project.get('name', '')))}\[([\w,.\s-]+)\]"
        for match in re.finditer(own, "\n".join(listed), re.MULTILINE | re.IGNORECASE):
            named += [e.strip() for e in match.group(1).split(",") if e.strip() not in named]
    return any(re.search(r"(^|[\s\"'\[,])pytest\b", text.lower()) for text in texts)


def test_runner(
    root: Path,
    pyproject: Mapping[str, Any],
    setup_cfg: configparser.ConfigParser,
    tox: configparser.ConfigParser,
    *,
    declared: bool,
) -> Runner | None:
    """pytest where the repository configures or uses it, or has plain test functions;
    unittest where every test file imports it and nothing asks for pytest; None: no tests."""
    configured = (
        any((root / name).is_file() for name in ("pytest.ini", "conftest.py", "tests/conftest.py"))
        or "pytest" in (pyproject.get("tool") or {})
        or setup_cfg.has_section("tool:pytest")
        or tox.has_section("pytest")
    )
    files = test_files(root)
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


def test_files(root: Path) -> list[Path]:
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


def test_command(root: Path, runner: Runner | None) -> str | None:
    """The command that runs the tests with `runner` (None: none)."""
    if runner == "pytest":
        return "python -m pytest"
    return _unittest_command(root) if runner == "unittest" else None


def _unittest_command(root: Path) -> str:
    if (root / "tests" / "__init__.py").is_file():
        return "python3 -m unittest discover -s tests -t ."
    return "python3 -m unittest discover"
