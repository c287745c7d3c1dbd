"""Detection on small trees that reproduce real projects' layouts (their sdists, read by hand:
the expected values are what those files say, not what the code printed), and on the hostile
cases. No Docker: files only."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from sandbox.detection import detection
from sandbox.environment import EnvironmentSpec, detect, from_table, to_toml
from tests.repos import tree

VENV_SETUP = [
    "python3 -m venv /opt/baton/venv",
    "python -m pip install --upgrade pip setuptools wheel",
]
COMPILER = ("build-essential", "pkg-config", "python3-dev")


# markupsafe 3.0.2: a C speedup declared in setup.py, pip-compiled requirements per purpose.
MARKUPSAFE = {
    "pyproject.toml": '[project]\nname = "MarkupSafe"\nversion = "3.0.2"\n'
    '[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n'
    '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    "setup.py": "from setuptools import Extension, setup\n"
    'ext_modules = [Extension("markupsafe._speedups", ["src/markupsafe/_speedups.c"])]\n'
    "setup(ext_modules=ext_modules)\n",
    "src/markupsafe/__init__.py": "",
    "src/markupsafe/_speedups.c": "#include <Python.h>\n",
    "requirements/build.txt": "build==1.2.2\n",
    "requirements/dev.txt": "pre-commit==4.0.1\ntox==4.21.2\npytest==8.3.3\n",
    "requirements/docs.txt": "sphinx==8.1.3\n",
    "requirements/tests.txt": "pytest==8.3.3\n",
    "requirements/typing.txt": "mypy==1.11.2\n",
    "tox.ini": "[testenv]\nuse_develop = true\ndeps = -r requirements/tests.txt\n",
    "tests/test_escape.py": "import pytest\n",
}


def test_a_c_extension_gets_a_compiler_headers_and_an_in_place_rebuild(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, MARKUPSAFE))

    assert spec.packages == COMPILER
    assert list(spec.setup) == [
        *VENV_SETUP,
        "python -m pip install -r requirements/tests.txt",
        "python -m pip install 'setuptools>=70.1'",
        "python -m pip install --no-build-isolation -e .",
    ]
    assert spec.build == ("python setup.py build_ext --inplace",)
    assert spec.build_inputs == ("*.c", "*.h", "setup.py", "pyproject.toml")
    assert "requirements/tests.txt" in spec.inputs and "requirements/dev.txt" not in spec.inputs


def test_the_reasons_name_the_test_set_and_what_was_left_out(tmp_path: Path) -> None:
    reasons = detection(tree(tmp_path, MARKUPSAFE)).reasons

    assert reasons[0] == (
        "test deps: requirements/tests.txt (test set; requirements/build.txt, "
        "requirements/dev.txt, requirements/docs.txt, requirements/typing.txt, tox [testenv] "
        "left out)"
    )


# PyYAML 6.0.2: Cython over libyaml, an in-tree backend wrapping setuptools.
PYYAML = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools", "wheel", '
    "\"Cython; python_version < '3.13'\"]\n"
    'backend-path = ["packaging"]\nbuild-backend = "_pyyaml_pep517"\n',
    "setup.py": "from setuptools import setup, Extension as _Extension\n"
    "if not self.ext_modules:\n    pass\n",
    "packaging/_pyyaml_pep517.py": "",
    "yaml/__init__.py": "",
    "yaml/_yaml.h": "\n#include <yaml.h>\n",
    "yaml/_yaml.pyx": "cimport yaml\n",
    "yaml/_yaml.pxd": "",
    "tests/legacy_tests/test_all.py": "import pytest\n",
}


def test_a_library_the_build_includes_is_installed(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, PYYAML))

    assert spec.packages == (*COMPILER, "libyaml-dev")
    assert (
        spec.setup[2]
        == "python -m pip install setuptools wheel 'Cython; python_version < '\"'\"'3.13'\"'\"''"
    )
    assert spec.build == ("python setup.py build_ext --inplace",)
    assert spec.build_inputs == ("*.pyx", "*.pxd", "*.pxi", "*.h", "setup.py", "pyproject.toml")
    assert spec.setup[-1] == "python -m pip install pytest"  # no set declares it


def test_a_header_the_tree_holds_itself_is_no_system_library(tmp_path: Path) -> None:
    files = {**PYYAML, "yaml/_yaml.h": '#include <zlib.h>\n#include "yaml.h"\n', "yaml/zlib.h": ""}

    assert detect(tree(tmp_path, files)).packages == COMPILER


# msgpack 1.1.0: Cython sources with their generated C, extensions appended in setup.py.
MSGPACK = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools >= 69.5.1"]\n'
    'build-backend = "setuptools.build_meta"\n[project]\nname = "msgpack"\n'
    'dynamic = ["version"]\n',
    "setup.py": "from setuptools import Extension, setup\next_modules = []\n"
    'ext_modules.append(Extension("msgpack._cmsgpack", sources=["msgpack/_cmsgpack.c"]))\n',
    "msgpack/_cmsgpack.c": '#include "Python.h"\n',
    "msgpack/_cmsgpack.pyx": "",
    "msgpack/unpack.h": "",
    "test/test_buffer.py": "from pytest import raises\n",
}


def test_cython_and_c_sources_are_both_build_inputs(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, MSGPACK))

    assert spec.build_inputs == (
        "*.c", "*.h", "*.pyx", "*.pxd", "*.pxi", "setup.py", "pyproject.toml",
    )  # fmt: skip
    assert spec.test == "python -m pytest"


# orjson 3.10.12: Rust through maturin.
ORJSON = {
    "pyproject.toml": '[project]\nname = "orjson"\n[build-system]\nbuild-backend = "maturin"\n'
    'requires = ["maturin>=1,<2"]\n',
    "Cargo.toml": '[package]\nname = "orjson"\n',
    "src/lib.rs": "",
    "test/test_api.py": "import pytest\n",
}


def test_maturin_gets_debians_rust_and_no_rebuild_command(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, ORJSON))

    assert spec.packages == ("build-essential", "pkg-config", "cargo", "rustc")
    assert "python -m pip install -e ." in spec.setup  # isolated: maturin comes with the build
    assert (spec.build, spec.build_inputs) == ((), ())


# contourpy 1.3.1: C++ through meson-python; its test extra names another of its extras.
CONTOURPY = {
    "pyproject.toml": '[build-system]\nbuild-backend = "mesonpy"\n'
    'requires = ["meson >= 1.2.0", "meson-python >= 0.13.1", "pybind11 >= 2.13.2"]\n'
    '[project]\nname = "contourpy"\n[project.optional-dependencies]\ndocs = ["furo"]\n'
    'mypy = ["contourpy[bokeh,docs]", "mypy == 1.11.1"]\n'
    'test = ["contourpy[test-no-images]", "matplotlib"]\n'
    'test-no-images = ["pytest", "wurlitzer"]\n',
    "meson.build": "",
    "src/contour_generator.cpp": "",
    "tests/test_filled.py": "import pytest\n",
}


def test_meson_python_installs_its_build_requirements_for_the_rebuild_on_import(
    tmp_path: Path,
) -> None:
    spec = detect(tree(tmp_path, CONTOURPY))

    assert spec.packages == (*COMPILER, "ninja-build")
    assert spec.setup[2:] == (
        "python -m pip install 'meson >= 1.2.0' 'meson-python >= 0.13.1' 'pybind11 >= 2.13.2'",
        "python -m pip install --no-build-isolation -e '.[test]'",
    )  # pytest comes with test-no-images, which the test extra names
    assert spec.build == ()


# attrs 24.2.0: hatch-vcs versioning, a test extra among six.
ATTRS = {
    "pyproject.toml": '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\n'
    'build-backend = "hatchling.build"\n[project]\nname = "attrs"\ndynamic = ["version"]\n'
    "[project.optional-dependencies]\n"
    'tests-mypy = ["mypy>=1.11.1"]\ntests = ["hypothesis", "pytest>=4.3.0"]\n'
    'cov = ["attrs[tests]"]\nbenchmark = ["pytest-codspeed"]\ndocs = ["furo"]\n'
    'dev = ["attrs[tests]", "pre-commit"]\n',
    "PKG-INFO": "Metadata-Version: 2.3\nName: attrs\nVersion: 24.2.0\n",
    "src/attr/__init__.py": "",
    "tests/test_funcs.py": "import pytest\n",
}


def test_a_git_versioned_build_is_told_the_version_git_would_say(tmp_path: Path) -> None:
    spec = detect(tree(tmp_path, ATTRS))

    assert spec.env["SETUPTOOLS_SCM_PRETEND_VERSION"] == "24.2.0"
    assert spec.setup[-1] == "python -m pip install -e '.[tests]'"
    assert spec.packages == ()


def test_without_pkg_info_the_version_is_the_repositorys_tag_else_a_placeholder(
    tmp_path: Path,
) -> None:
    files = {k: v for k, v in ATTRS.items() if k != "PKG-INFO"}
    root = tree(tmp_path, files)

    # a checkout of a tagged release (pluggy's tests need a pytest that needs pluggy >= 1.5:
    # installed as 0.0.0, pip would settle for a pytest too old to run at all)
    assert detect(root, version="24.2.0").env["SETUPTOOLS_SCM_PRETEND_VERSION"] == "24.2.0"
    assert detect(root).env["SETUPTOOLS_SCM_PRETEND_VERSION"] == "0.0.0"


# frozenlist 1.5.0: Cython through an in-tree backend; only dev/ci/doc requirements.
FROZENLIST = {
    "pyproject.toml": '[build-system]\nrequires = ["expandvars", "setuptools >= 47"]\n'
    'backend-path = ["packaging"]\nbuild-backend = "pep517_backend.hooks"\n',
    "setup.cfg": "[metadata]\nname = frozenlist\n",
    "frozenlist/_frozenlist.pyx": "",
    "requirements/ci.txt": "pytest==8.3.3\n",
    "requirements/dev.txt": "-r ci.txt\n",
    "requirements/doc.txt": "sphinx\n",
    "pytest.ini": "[pytest]\n",
}


def test_an_unknown_backend_gets_the_compiler_but_no_guessed_rebuild(tmp_path: Path) -> None:
    found = detection(tree(tmp_path, FROZENLIST))

    assert found.spec.packages == COMPILER
    assert found.spec.build == ()
    assert "python -m pip install -e ." in found.spec.setup  # isolated: its backend's own needs
    assert "python -m pip install -r requirements/dev.txt" in found.spec.setup  # no test set
    assert found.reasons[0].startswith("test deps: requirements/dev.txt (dev set: no test set")


def test_native_sources_only_in_the_tests_build_nothing(tmp_path: Path) -> None:
    files = {"setup.py": "from setuptools import setup\nsetup()\n", "tests/data/x.c": ""}

    spec = detect(tree(tmp_path, files))

    assert (spec.packages, spec.build) == ((), ())


def test_a_node_addon_and_a_build_script(tmp_path: Path) -> None:
    manifest = '{"name": "a", "gypfile": true, "scripts": {"build": "tsc", "test": "jest"}}'
    files = {"package.json": manifest, "package-lock.json": "{}", "src/addon.cc": ""}

    spec = detect(tree(tmp_path, files))

    assert spec.packages == ("build-essential", "pkg-config", "python3")
    assert spec.setup == ("npm ci --no-audit --no-fund", "npm run build")
    assert (spec.build, spec.build_inputs) == (("npm run build",), ())
    assert spec.test == "npm test -- --verbose"  # jest names each test only when verbose


@pytest.mark.parametrize(
    ("script", "test"),
    [
        ("node --throw-deprecation node_modules/.bin/jest test/unit/", "npm test -- --verbose"),
        ("jest --coverage", "npm test -- --verbose"),
        ("npm run build && jest", "npm test"),  # `--verbose` would reach only the last command
        ("tap test/*.js", "npm test"),
        ("node --test", "npm test"),
        ("jester", "npm test"),
    ],
)
def test_only_a_test_script_that_is_one_jest_command_is_made_verbose(
    tmp_path: Path, script: str, test: str
) -> None:
    manifest = json.dumps({"name": "a", "scripts": {"test": script}})

    assert detect(tree(tmp_path, {"package.json": manifest})).test == test


# -- test sets -------------------------------------------------------------------------------


def test_a_test_dependency_group_wins_over_dev_and_lint(tmp_path: Path) -> None:
    pyproject = (
        '[project]\nname = "g"\nversion = "0"\n[dependency-groups]\n'
        'dev = ["tox", {include-group = "tests"}]\ntests = ["pytest", "coverage"]\n'
        'lint = ["ruff"]\n'
    )
    spec = detect(tree(tmp_path, {"pyproject.toml": pyproject, "requirements-dev.txt": "tox\n"}))

    assert spec.setup[-1] == "python -m pip install pytest coverage"
    assert not any("requirements-dev.txt" in command for command in spec.setup)


def test_tox_deps_in_pyproject_expand_requirement_files_inside_the_repository(
    tmp_path: Path,
) -> None:
    legacy = (
        "[tool.tox]\nlegacy_tox_ini = '''\n[tox]\nenvlist = py3\n[testenv]\n"
        "deps =\n    -r{toxinidir}/ci/test-deps.txt\n    -r ../../etc/passwd\n"
        "    --index-url=http://elsewhere\n    py38: six\n    mock\n'''\n"
    )
    files = {"pyproject.toml": '[project]\nname = "t"\nversion = "0"\n' + legacy,
             "ci/test-deps.txt": "pytest\n"}  # fmt: skip

    spec = detect(tree(tmp_path, files))

    assert spec.setup[2:] == (
        "python -m pip install -r ci/test-deps.txt",
        "python -m pip install -e .",
        "python -m pip install mock",
    )
    assert "ci/test-deps.txt" in spec.inputs


def test_a_nox_test_session_is_read_without_running_it(tmp_path: Path) -> None:
    noxfile = (
        "import nox\nTEST_DEPS = ['pytest', 'hypothesis']\n"
        "@nox.session(python=['3.11'])\ndef tests(session):\n"
        "    session.install('-e', '.[toml]')\n    session.install(*TEST_DEPS)\n"
        "    raise SystemExit('never run')\n"
        "@nox.session(name='docs')\ndef build_docs(session):\n    session.install('sphinx')\n"
    )
    files = {"setup.py": "from setuptools import setup\nsetup()\n", "noxfile.py": noxfile}

    spec = detect(tree(tmp_path, files))

    assert spec.setup[2:] == (
        "python -m pip install -e '.[toml]'",
        "python -m pip install pytest hypothesis",
    )
    assert "noxfile.py" in spec.inputs


@pytest.mark.parametrize(
    ("name", "chosen"),
    [
        ("test-requirements.txt", "test-requirements.txt"),
        ("requirements_tests.txt", "requirements_tests.txt"),
        ("requirements/testing.txt", "requirements/testing.txt"),
    ],
)
def test_test_requirement_files_by_their_usual_names(
    tmp_path: Path, name: str, chosen: str
) -> None:
    files = {name: "pytest\n", "requirements/dev.txt": "tox\n", "app.py": ""}

    spec = detect(tree(tmp_path, files))

    assert [c for c in spec.setup if " -r " in c] == [f"python -m pip install -r {chosen}"]


# -- the printed spec ------------------------------------------------------------------------


def test_the_printed_spec_reads_back_as_the_same_spec(tmp_path: Path) -> None:
    found = detection(tree(tmp_path, MARKUPSAFE))

    text = to_toml(found.spec, found.reasons)

    again = from_table(tomllib.loads(text), origin="printed")
    assert again.model_dump(exclude={"source"}) == found.spec.model_dump(exclude={"source"})
    assert text.startswith("# test deps: requirements/tests.txt")


def test_the_printed_spec_is_plain_toml() -> None:
    spec = EnvironmentSpec(
        packages=("gcc",), setup=('echo "a\\b"', "make"), test="make check", env={"A": "1\x7f"}
    )

    assert to_toml(spec, ["why:\nthis"]) == (
        "# why: this\n"
        'packages = ["gcc"]\n'
        "setup = [\n"
        '    "echo \\"a\\\\b\\"",\n'
        '    "make",\n'
        "]\n"
        'test = "make check"\n'
        "\n"
        "[env]\n"
        'A = "1\\u007f"\n'
    )


def test_a_noxfile_nested_past_the_parser_is_read_as_none(tmp_path: Path) -> None:
    files = {"setup.py": "from setuptools import setup\nsetup()\n",
             "noxfile.py": "x = " + "-" * 50_000 + "1\n"}  # fmt: skip

    spec = detect(tree(tmp_path, files))

    assert spec.setup[-1] == "python -m pip install -e ."


def test_a_prepare_script_installing_git_hooks_is_skipped_but_dependencies_build(
    tmp_path: Path,
) -> None:
    # uuid 9.0.1: husky from `prepare`, which needs the .git the build container has not.
    manifest = (
        '{"name": "uuid", "scripts": {"prepare": "cd $( git rev-parse --show-toplevel ) && '
        'husky install", "build": "./scripts/build.sh", "test": "jest test/unit/"}}'
    )
    files = {"package.json": manifest, "package-lock.json": "{}"}

    spec = detect(tree(tmp_path, files))

    assert spec.setup == (
        "npm ci --no-audit --no-fund --ignore-scripts && npm rebuild",
        "npm run build",
    )


@pytest.mark.parametrize(
    ("build_system", "sources", "packages"),
    [
        (
            '[build-system]\nrequires = ["scikit-build-core"]\n'
            'build-backend = "scikit_build_core.build"\n',
            {"src/fast.cpp": ""},
            (*COMPILER, "cmake", "ninja-build"),
        ),
        (
            '[build-system]\nrequires = ["setuptools", "setuptools-rust"]\n'
            'build-backend = "setuptools.build_meta"\n',
            {"Cargo.toml": "", "src/lib.rs": ""},
            (*COMPILER, "cargo", "rustc"),
        ),
    ],
)
def test_backends_that_rebuild_into_the_venv_get_their_tools_and_no_build(
    tmp_path: Path, build_system: str, sources: dict[str, str], packages: tuple[str, ...]
) -> None:
    files = {"pyproject.toml": '[project]\nname = "n"\nversion = "1"\n' + build_system, **sources}

    spec = detect(tree(tmp_path, files))

    assert (spec.packages, spec.build) == (packages, ())
    assert "python -m pip install -e ." in spec.setup


def test_pyproject_extensions_without_setup_py_rebuild_through_setuptools(tmp_path: Path) -> None:
    pyproject = (
        '[project]\nname = "n"\nversion = "1"\n'
        '[build-system]\nrequires = ["setuptools>=74.1"]\nbuild-backend = "setuptools.build_meta"\n'
        '[tool.setuptools]\next-modules = [{name = "n._c", sources = ["n/_c.c"], '
        'libraries = ["z"]}]\n'
    )
    spec = detect(tree(tmp_path, {"pyproject.toml": pyproject, "n/_c.c": "#include <zlib.h>\n"}))

    assert spec.build == ('python -c "from setuptools import setup; setup()" build_ext --inplace',)
    assert spec.build_inputs == ("*.c", "*.h", "pyproject.toml")
    assert spec.packages == (*COMPILER, "zlib1g-dev")


def test_libraries_named_in_setup_py_are_installed(tmp_path: Path) -> None:
    setup_py = (
        "from setuptools import Extension, setup\n"
        "setup(ext_modules=[Extension('x', ['x.c'], libraries=['yaml', 'm', 'crypto'])])\n"
    )
    spec = detect(tree(tmp_path, {"setup.py": setup_py, "x.c": ""}))

    assert spec.packages == (*COMPILER, "libssl-dev", "libyaml-dev")  # libm is libc's


def test_tox_4_toml_deps_and_extras_are_read(tmp_path: Path) -> None:
    tox_toml = (
        '[env_run_base]\ndeps = ["pytest-xdist", "-r requirements/base.txt"]\nextras = ["test"]\n'
    )
    files = {
        "pyproject.toml": '[project]\nname = "t"\nversion = "0"\n',
        "tox.toml": tox_toml,
        "requirements/base.txt": "pytest\n",
    }

    spec = detect(tree(tmp_path, files))

    assert spec.setup[2:] == (
        "python -m pip install -r requirements/base.txt",
        "python -m pip install -e '.[test]'",
        "python -m pip install pytest-xdist",
    )
    assert "tox.toml" in spec.inputs
