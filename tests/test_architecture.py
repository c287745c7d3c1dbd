"""The dependency rule of shared/DESIGN.md: workers → orchestrator, workers → sandbox; the
orchestrator never imports workers; sandbox imports nothing else from the project; and none of
them imports (or names) the test kit or the demo, which stand outside the product. The fake
Gemini server stands in for an outside service, so it imports nothing of Baton either.

Within the orchestrator, the workers and the run core (`orchestrator.core`) import only the core,
never the control plane (`orchestrator.control`), nor name it in a string; and importing a module
of the core loads neither the control plane nor what only it needs (FastAPI, click, rich).

The engine (the workers and the run core) names no stage or field of the fixer, which is one
pipeline among others: computed from the fixer's own spec and schema classes, less the field
names of the engine's fact types and a listed few words of its own (`COINCIDENCES`)."""

from __future__ import annotations

import ast
import functools
import importlib
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import BatonError
from sandbox.errors import SandboxError

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"orchestrator", "workers", "sandbox", "testkit", "demo", "bench", "images"}
CORE = ("orchestrator", "workers", "sandbox")
"""The product. The test kit and the demo stand outside it: the product never imports them."""
MODULE_NAME = re.compile(r"^([a-z_]+)(?:\.[a-z_]+)*(?::[A-Za-z_]\w*)?$")
"""A string that reads as a module path (`workers.app`, `testkit.gemini`, `pkg.mod:attr`)."""
FORBIDDEN_BY_NAME = {
    "orchestrator": {"workers", "testkit", "demo"},
    "workers": {"testkit", "demo"},
    "sandbox": {"orchestrator", "workers", "testkit", "demo"},
}
"""Packages a core package may not name in a string either (`"workers.app"`, say), the way
`celery -A` or `importlib.import_module` would reach them past the import rule."""


def python_files(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "sample_repo" not in p.parts]


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for all the checks (which only read it)."""
    return ast.parse(path.read_text())


def imported_packages(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in python_files(package):
        names: set[str] = set()
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names & PROJECT
    return found


def named_packages(package: str) -> dict[str, set[str]]:
    """The project packages each file names in a string constant that reads as a module path
    (docstrings left out: prose may mention a module)."""
    found: dict[str, set[str]] = {}
    for path in python_files(package):
        tree = syntax_tree(path)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        names = {
            match.group(1)
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (match := MODULE_NAME.match(node.value))
            and "." in node.value
        }
        found[str(path.relative_to(ROOT))] = names & PROJECT
    return found


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("orchestrator", {"orchestrator"}),
        ("sandbox", {"sandbox"}),
        ("workers", {"workers", "orchestrator", "sandbox"}),
        ("testkit", {"testkit", "orchestrator", "workers", "sandbox"}),
        ("testkit/gemini", {"testkit"}),
        ("demo", {"demo", "testkit", "orchestrator", "workers", "sandbox"}),
    ],
)
def test_packages_import_only_what_the_design_allows(package: str, allowed: set[str]) -> None:
    breaking = {
        path: names - allowed
        for path, names in imported_packages(package).items()
        if names - allowed
    }
    assert breaking == {}


@pytest.mark.parametrize("package", CORE)
def test_core_packages_never_name_what_they_may_not_import(package: str) -> None:
    forbidden = FORBIDDEN_BY_NAME[package]
    breaking = {
        path: names & forbidden
        for path, names in named_packages(package).items()
        if names & forbidden
    }
    assert breaking == {}


RUN_CORE = "orchestrator.core"
"""What the workers and the run core may import of the orchestrator: the core only."""
CONTROL_PLANE = "orchestrator.control"


def orchestrator_modules_imported(tree: ast.Module) -> set[str]:
    """The orchestrator modules a file imports, by full name (`from orchestrator import x` as
    `orchestrator.x`, which is either a module or a name the control plane's API lends)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "orchestrator":
                found |= {f"orchestrator.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return {name for name in found if name.split(".")[0] == "orchestrator"}


def orchestrator_modules_named(tree: ast.Module) -> set[str]:
    """The orchestrator modules a file names in a string that reads as a module path."""
    return {
        node.value.partition(":")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and MODULE_NAME.match(node.value)
        and node.value.startswith("orchestrator.")
    }


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


@pytest.mark.parametrize("package", ["workers", "orchestrator/core"])
def test_workers_and_the_run_core_import_only_the_run_core(package: str) -> None:
    breaking = {
        str(path.relative_to(ROOT)): outside
        for path in python_files(package)
        if (
            outside := {
                name
                for name in orchestrator_modules_imported(syntax_tree(path))
                if not inside(name, RUN_CORE)
            }
        )
    }
    assert breaking == {}


@pytest.mark.parametrize("package", ["workers", "orchestrator/core"])
def test_workers_and_the_run_core_never_name_the_control_plane(package: str) -> None:
    breaking = {
        str(path.relative_to(ROOT)): named
        for path in python_files(package)
        if (
            named := {
                name
                for name in orchestrator_modules_named(syntax_tree(path))
                if inside(name, CONTROL_PLANE)
            }
        )
    }
    assert breaking == {}


def test_the_core_checks_see_the_control_plane_imported_or_named() -> None:
    """A negative control for the two checks above."""
    tree = ast.parse(
        "from orchestrator import enqueue\nimport orchestrator.control.api\n"
        "from orchestrator.core import keys\nAPP = 'orchestrator.control.cli:main'\n"
    )
    assert orchestrator_modules_imported(tree) == {
        "orchestrator.enqueue",
        "orchestrator.control.api",
        "orchestrator.core",
    }
    assert orchestrator_modules_named(tree) == {"orchestrator.control.cli"}


def test_importing_the_run_core_loads_no_control_plane() -> None:
    """Python runs `orchestrator/__init__.py` before any submodule: it must load nothing of the
    control plane, nor FastAPI, click or rich, for a worker importing the store. Checked in a
    fresh interpreter, whose modules no other test has loaded."""
    code = (
        "import sys\nimport orchestrator.core.store\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'click', 'rich') or m.startswith('orchestrator.control')))\n"
        "import orchestrator\norchestrator.enqueue\n"
        "print('orchestrator.control.api' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == ["[]", "True"]


def test_the_string_check_sees_a_module_named_in_a_string(tmp_path: Path) -> None:
    """The check above is only worth something if it fires: a negative control."""
    code = 'APP = "workers.app"\nSCENARIO = "testkit.gemini:Scenario"\nTEXT = "a sentence."\n'
    tree = ast.parse(code)
    named = {
        m.group(1)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (m := MODULE_NAME.match(node.value))
        and "." in node.value
    }
    assert named & PROJECT == {"workers", "testkit"}


ENGINE = ("workers", "orchestrator/core")
"""What runs any pipeline: it names none of the fixer's stages or fields."""
COINCIDENCES: dict[str, tuple[frozenset[str], str]] = {
    "branch": (frozenset({"workers/inputs.py", "orchestrator/core/conductor.py",
                          "orchestrator/core/fanout.py", "workers/subsessions.py",
                          "orchestrator/core/branches.py"}),
               "an audit entry's branch label, `<pipeline>.<stage>` (`.<branch>` for a branch), "
               "and the `{branch}` a fan-out stage's branch reads its id by"),
    "proof": (frozenset({"orchestrator/core/branches.py"}),
              'a fan-out stage\'s `select = "proof"`: selection by the measured proof'),
    "commit": (frozenset({"orchestrator/core/store.py", "workers/envcli.py", "workers/publish.py",
                          "workers/tools/container.py", "workers/environments.py"}),
               "the run's pinned commit, git's `commit` command and object type, and the commit "
               "an environment's products were built from"),
    "path": (frozenset({"workers/tools/code.py", "workers/tools/workspace.py"}),
             "the code tools' `path` argument in their results, and ripgrep's sort key"),
    "plan": (frozenset({"orchestrator/core/gates.py", "orchestrator/core/autonomy.py"}),
             "a gate's kind (`approve = \"plan\"`): an output a person approves and may edit"),
    "test_command": (frozenset({"workers/environments.py", "workers/envcli.py"}),
                     "an environment's own test command (`Environment.test_command`)"),
}  # fmt: skip
"""Words of the engine's own that happen to be fixer field names too, and the only files that
may use them, with what they mean there. A file that needs one more says why here."""


def string_constants(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of a module, docstrings left out (prose may say `proof`)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    ]  # fmt: skip


def fixer_names() -> set[str]:
    """The names the engine must not hold: every field of the fixer's schema classes and every
    stage (output key) of its spec, less the field names of the engine's own fact types, which
    the fixer's schemas hold as they are (`Proof.reason`)."""
    from orchestrator.core.facts import FACT_TYPES
    from tests.twin import fixer_field_names, fixer_spec

    stages = {stage["name"] for stage in fixer_spec()["stages"]}
    engine = {name for fact in FACT_TYPES for name in fact.model_fields}
    return (fixer_field_names() | stages) - engine


def fixer_names_held(path: str, tree: ast.Module, names: set[str]) -> list[str]:
    return [
        f"{path}:{node.lineno} {node.value!r}"
        for node in string_constants(tree)
        if node.value in names and path not in COINCIDENCES.get(node.value, (frozenset(), ""))[0]
    ]


def test_the_engine_names_no_field_or_stage_of_the_fixer() -> None:
    """Proof, verification, loops, publication and stop rules read the fields a spec names and
    the facts a schema declares (docs/pipelines.md): a string in the engine equal to a fixer
    field would be the engine reading the fixer by name."""
    names = fixer_names()
    held = [
        found
        for package in ENGINE
        for file in python_files(package)
        for found in fixer_names_held(str(file.relative_to(ROOT)), syntax_tree(file), names)
    ]
    assert held == [], "or, if it is a word of the engine's own, say so in COINCIDENCES"


def test_the_fixer_names_check_sees_a_field_read_by_name() -> None:
    """A negative control for the check above, over names it computed."""
    names = fixer_names()
    assert {"proof", "test_command", "test_files", "expected_failure", "reproduced",
            "summary", "fix", "reproduce"} <= names  # fmt: skip
    assert "reason" not in names and "passed" not in names  # the engine's `Proof` has them
    tree = ast.parse(
        '"""The proof."""\ncommand = output["test_command"]\nok = output.get("proof")\n'
        'label = {"branch": x}\nverdict = {"reason": r}\n'
    )
    assert fixer_names_held("workers/stage.py", tree, names) == [
        "workers/stage.py:2 'test_command'", "workers/stage.py:3 'proof'",
        "workers/stage.py:4 'branch'",
    ]  # fmt: skip
    assert fixer_names_held("workers/inputs.py", tree, names) == [
        "workers/inputs.py:2 'test_command'", "workers/inputs.py:3 'proof'"
    ]  # fmt: skip


def test_no_test_double_lives_in_the_product() -> None:
    """Fakes, stubs and in-memory stand-ins belong to the test kit."""
    doubles = [
        str(path.relative_to(ROOT))
        for package in CORE
        for path in python_files(package)
        for node in ast.walk(syntax_tree(path))
        if isinstance(node, ast.ClassDef)
        and re.match(r"(Fake|Stub|Mock|Dummy|Memory|Local)[A-Z]", node.name)
    ]
    assert doubles == []


def error_classes() -> list[type[Exception]]:
    """Every error class of the product: the subclasses of each package's root, found by
    importing every module of the core packages (not a hand-written list)."""
    for package in CORE:
        for path in python_files(package):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            importlib.import_module(module.removesuffix(".__init__"))
    found: list[type[Exception]] = []
    pending: list[type[Exception]] = [BatonError, SandboxError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


ERROR_CLASSES = error_classes()


def test_the_error_classes_found_include_every_package_s_errors() -> None:
    """A negative control for the search above: it finds errors of every package."""
    modules = {cls.__module__ for cls in ERROR_CLASSES}
    assert {
        "orchestrator.core.errors",
        "workers.errors",
        "workers.tools.errors",
        "sandbox.errors",
    } <= (modules)
    assert len(ERROR_CLASSES) >= 29


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_error_survives_pickling_with_its_message(cls: type[Exception]) -> None:
    error = cls("something went wrong: x")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert "something went wrong: x" in str(copy)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_error_class_says_when_it_is_raised(cls: type[Exception]) -> None:
    assert (cls.__doc__ or "").startswith(("Raised when", "Raised at", "Raised in", "Root of"))
