"""Environment specs: read from `.baton/environment.toml`, or detected from a repository's files;
and the key that says when an environment must be built again. No Docker: files only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox.environment import VENV, EnvironmentSpec, detect, environment_key, load
from sandbox.errors import EnvironmentSpecError
from tests.repos import tree

BASE = "sha256:" + "b" * 64
REPO = "0123456789abcdef"


PYPROJECT = """
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "shop"
version = "1.0"
dependencies = ["attrs>=23"]

[project.optional-dependencies]
test = ["pytest>=8", "hypothesis"]
docs = ["sphinx"]
"""


def test_a_python_project_installs_itself_with_its_test_extra_and_runs_pytest(
    tmp_path: Path,
) -> None:
    root = tree(tmp_path, {"pyproject.toml": PYPROJECT, "src/shop/__init__.py": ""})

    spec = detect(root)

    assert spec.languages == ("python",)
    assert spec.setup[0] == f"python3 -m venv {VENV}"
    assert "python -m pip install -e '.[test]'" in spec.setup
    assert spec.test == "python -m pytest"
    assert spec.env["PATH"].startswith(f"{VENV}/bin:")
    assert spec.inputs == ("pyproject.toml",)


def test_the_test_requirements_file_is_installed_but_not_the_docs_one(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "requirements.txt": "requests==2.32.3\n",
            "requirements-test.txt": "pytest\n",
            "requirements/docs.txt": "sphinx\n",
            "app.py": "",
        },
    )

    spec = detect(root)

    installs = [c for c in spec.setup if " -r " in c]
    assert installs == [
        "python -m pip install -r requirements.txt",
        "python -m pip install -r requirements-test.txt",
    ]
    assert spec.inputs == ("requirements-test.txt", "requirements.txt")
    assert spec.test == "python -m pytest"  # pytest is in a requirements file


def test_a_setup_cfg_test_extra_is_preferred_to_tox_deps(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "setup.py": "from setuptools import setup\nsetup()\n",
            "setup.cfg": "[metadata]\nname = x\n[options.extras_require]\ntesting =\n    pytest\n",
            "tox.ini": "[testenv]\ndeps =\n    mock\n    -rrequirements.txt\n    py3{8,9}: six\n",
        },
    )

    spec = detect(root)

    assert spec.setup[-1] == "python -m pip install -e '.[testing]'"  # pytest comes with it
    assert spec.inputs == ("setup.cfg", "setup.py", "tox.ini")


def test_dependency_groups_are_expanded(tmp_path: Path) -> None:
    groups = """
[project]
name = "g"
version = "0"
[dependency-groups]
lint = ["ruff"]
test = ["pytest", {include-group = "fixtures"}]
fixtures = ["freezegun"]
"""
    spec = detect(tree(tmp_path, {"pyproject.toml": groups}))

    assert spec.setup[-1] == "python -m pip install pytest freezegun"


def test_a_standard_library_project_installs_nothing_and_runs_unittest(tmp_path: Path) -> None:
    unit = "import unittest\n\nclass CartTest(unittest.TestCase):\n    def test_total(self): ...\n"
    root = tree(
        tmp_path, {"shopcart/cart.py": "", "tests/__init__.py": "", "tests/test_cart.py": unit}
    )

    spec = detect(root)

    assert (spec.languages, spec.setup) == (("python",), ())
    assert spec.test == "python3 -m unittest discover -s tests -t ."


def test_a_node_package_with_a_lockfile_installs_exactly(tmp_path: Path) -> None:
    manifest = {"name": "n", "scripts": {"test": "node --test"}}
    root = tree(tmp_path, {"package.json": json.dumps(manifest), "package-lock.json": "{}"})

    spec = detect(root)

    assert (spec.languages, spec.setup, spec.test) == (
        ("node",),
        ("npm ci --no-audit --no-fund",),
        "npm test",
    )
    assert spec.inputs == ("package-lock.json", "package.json")


def test_npm_inits_placeholder_is_not_a_test_command(tmp_path: Path) -> None:
    manifest = {"scripts": {"test": 'echo "Error: no test specified" && exit 1'}}
    spec = detect(tree(tmp_path, {"package.json": json.dumps(manifest)}))

    assert (spec.setup, spec.test) == (("npm install --no-audit --no-fund",), None)


def test_plain_test_functions_need_pytest_even_without_a_manifest(tmp_path: Path) -> None:
    root = tree(tmp_path, {"calc.py": "", "tests/test_calc.py": "def test_add():\n    pass\n"})

    spec = detect(root)

    assert (spec.setup[-1], spec.test) == ("python -m pip install pytest", "python -m pytest")


def test_a_repository_with_nothing_to_install_has_an_empty_spec(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, {"README.md": "hello"}))

    assert spec == EnvironmentSpec()


def test_the_repositorys_own_spec_wins_and_keys_itself(tmp_path: Path) -> None:
    own = """
packages = ["libxml2-dev"]
setup = ["pip install -e ."]
test = "make check"
inputs = ["constraints/*.txt"]
[env]
DJANGO_SETTINGS_MODULE = "tests.settings"
[limits]
memory_mb = 2048
"""
    root = tree(tmp_path, {".baton/environment.toml": own, "pyproject.toml": PYPROJECT})

    spec = detect(root)

    assert spec.source == "file"
    assert (spec.packages, spec.setup, spec.test) == (
        ("libxml2-dev",),
        ("pip install -e .",),
        "make check",
    )
    assert spec.limits.memory_mb == 2048
    assert spec.inputs == (".baton/environment.toml", "constraints/*.txt")


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("setup = [", "not a readable TOML file"),
        ('test = ["a", "b"]', "test must be one command"),
        ('packages = ["rm -rf /"]', "packages: 'rm -rf /' is not a Debian package name"),
        ("[env]\nGITHUB_TOKEN = 'x'", "looks like a secret"),
        ("[limits]\nmemory_mb = 1", "limits.memory_mb"),
        ('inputs = ["../outside"]', "inside the repository"),
        ("unknown = 1", "unknown: Extra inputs are not permitted"),
    ],
)
def test_a_bad_spec_file_is_refused_naming_the_file_and_the_fault(
    tmp_path: Path, text: str, fault: str
) -> None:
    path = tmp_path / "environment.toml"
    path.write_text(text)

    with pytest.raises(EnvironmentSpecError) as raised:
        load(path)

    assert str(raised.value).startswith(str(path))
    assert fault in str(raised.value)


def test_the_key_changes_with_a_dependency_file_and_not_with_other_files(tmp_path: Path) -> None:
    root = tree(
        tmp_path, {"requirements.txt": "attrs==23.1\n", "app.py": "x = 1\n", "README.md": ""}
    )
    spec = detect(root)
    first = environment_key(spec, root, BASE, repository=REPO)

    (root / "README.md").write_text("changed")
    (root / "app.py").write_text("x = 2\n")
    after_other_files = environment_key(detect(root), root, BASE, repository=REPO)
    (root / "requirements.txt").write_text("attrs==24.1\n")
    after_requirements = environment_key(detect(root), root, BASE, repository=REPO)

    assert after_other_files == first
    assert after_requirements != first
    other_base = environment_key(spec, root, "sha256:" + "c" * 64, repository=REPO)
    assert other_base != first
    assert len(first) == 16 and int(first, 16) >= 0


def test_the_same_files_in_another_repository_make_another_key(tmp_path: Path) -> None:
    """A build runs the repository's own code: a hostile repository copying a victim's
    dependency files must not build the image the victim's runs then use."""
    root = tree(tmp_path, {"requirements.txt": "attrs==23.1\n", "setup.py": "evil()\n"})
    spec = detect(root)

    assert environment_key(spec, root, BASE, repository="victim") != environment_key(
        spec, root, BASE, repository="attacker"
    )


def test_inputs_never_follow_a_symlink_out_of_the_repository(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    root = tree(tmp_path / "repo", {".baton/environment.toml": 'inputs = ["*.txt"]', "a.txt": "a"})
    (root / "leak.txt").symlink_to(outside)

    spec = detect(root)
    key = environment_key(spec, root, BASE, repository=REPO)
    outside.write_text("changed")

    assert environment_key(spec, root, BASE, repository=REPO) == key
