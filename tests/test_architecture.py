"""The dependency rule of shared/DESIGN.md: workers → orchestrator, workers → sandbox; the
orchestrator never imports workers; sandbox imports nothing else from the project."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from orchestrator import errors as orchestrator_errors
from workers import errors as worker_errors
from workers.tools.errors import ToolError

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"orchestrator", "workers", "sandbox", "bench"}


def imported_packages(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        if "sample_repo" in path.parts:
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names & PROJECT
    return found


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("orchestrator", {"orchestrator"}),
        ("sandbox", {"sandbox"}),
        ("workers", {"workers", "orchestrator", "sandbox"}),
    ],
)
def test_packages_import_only_what_the_design_allows(package: str, allowed: set[str]) -> None:
    breaking = {
        path: names - allowed
        for path, names in imported_packages(package).items()
        if names - allowed
    }
    assert breaking == {}


ERRORS = [
    orchestrator_errors.BatonError("x"),
    orchestrator_errors.ConfigError("x"),
    orchestrator_errors.IntakeError("bad", "issue.title"),
    orchestrator_errors.PayloadTooLargeError("too big", None),
    orchestrator_errors.PipelineError("x"),
    orchestrator_errors.RepoError("x"),
    orchestrator_errors.RunNotFoundError("r1"),
    worker_errors.RateLimitedError("429", 3.0),
    worker_errors.QuotaWaitError("quota", 12.0),
    worker_errors.StageCancelledError("cancelled"),
    worker_errors.StageError("x"),
    worker_errors.ModelRejectedError("x"),
    worker_errors.ModelUnavailableError("x"),
    worker_errors.ModelCallLimitError("x"),
    worker_errors.StageOutputError("x"),
    worker_errors.InfrastructureError("x"),
    worker_errors.PublishError("x"),
    ToolError("x"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_survives_pickling_with_its_message(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
