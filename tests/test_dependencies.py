"""Declared equals imported: every third-party module Baton's own packages import belongs to a
distribution pyproject.toml names, in its dependencies or, for a module imported only where an
extra's feature runs, in that extra."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "workers", "sandbox", "testkit", "demo", "evaluation", "images")
"""Baton's packages: what pyproject.toml installs (and `images`, which `make images` runs)."""
NOT_BATONS = ("demo/sample_repo",)
"""Folders in them that are not Baton's code: the demo's sample repository, which a sandbox runs."""
EXTRA_ONLY = {
    "workers/lite_llm.py": "litellm",
    "demo/make_sentry_event.py": "dev",
}
"""Files that run only with an extra installed, and that extra: LiteLLM's stages; the script
that makes the demo's Sentry event (run by hand, with the dev tools)."""


def declared() -> dict[str, set[str]]:
    """The distributions pyproject.toml names, by where: "" for the dependencies, else the
    extra's name (an extra that names `baton[other]` holds the other's too)."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    where: dict[str, set[str]] = {"": set()}
    own: dict[str, list[str]] = {}
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    for extra, texts in groups.items():
        names = where.setdefault(extra, set())
        for text in texts:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "baton":
                own.setdefault(extra, []).extend(requirement.extras)
            else:
                names.add(canonicalize_name(requirement.name))
    for extra, others in own.items():
        for other in others:
            where[extra] |= where[other]
    return where


def imports(path: Path) -> Iterator[str]:
    """The top-level names of every absolute import in the file at `path`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def third_party() -> dict[str, set[str]]:
    """Each third-party top-level module Baton's packages import, with the files importing it."""
    ours = {*PACKAGES, "bench"}
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(NOT_BATONS):
                continue
            for name in imports(path):
                if name not in sys.stdlib_module_names and name not in ours:
                    found.setdefault(name, set()).add(relative)
    return found


def distributions_of(module: str) -> set[str]:
    return {
        canonicalize_name(name)
        for name in importlib.metadata.packages_distributions().get(module, [])
    }


def test_every_module_baton_imports_comes_from_a_distribution_it_declares() -> None:
    where = declared()
    problems = []
    for module, files in sorted(third_party().items()):
        dists = distributions_of(module)
        assert dists, f"{module} (imported by {sorted(files)}) belongs to no installed distribution"
        for file in sorted(files):
            allowed = where[""] | where.get(EXTRA_ONLY.get(file, ""), set())
            if not dists & allowed:
                problems.append(f"{file} imports {module} ({', '.join(sorted(dists))})")
    assert problems == [], "imported, not declared in pyproject.toml:\n" + "\n".join(problems)


def test_control_a_module_of_the_dev_tools_only_is_not_declared_for_the_product() -> None:
    """The check can fail: pytest is installed (dev) but declared for no product file."""
    where = declared()

    assert distributions_of("pytest") == {"pytest"}
    assert "pytest" in where["dev"] and "pytest" not in where[""]
    assert "litellm" in where["litellm"] and "litellm" not in where[""]


def test_the_walk_finds_what_product_code_imports() -> None:
    found = third_party()

    assert "workers/lite_llm.py" in found["litellm"]
    assert "sandbox/egress.py" in found["h11"]
    assert "pytest" not in found  # a test import is not product code
