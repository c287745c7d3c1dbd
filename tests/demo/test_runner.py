from __future__ import annotations

import io

import pytest
from rich.console import Console

from demo.runner import demo_summary, run_demo
from orchestrator.core.errors import ConfigError
from orchestrator.core.models import (
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.settings import Settings


def test_the_demo_refuses_the_real_model_without_a_key_before_starting_anything() -> None:
    settings = Settings().model_copy(update={"google_api_key": None, "redis_url": None})
    said = io.StringIO()

    with pytest.raises(ConfigError, match="--real-model needs GOOGLE_API_KEY"):
        run_demo(settings, timeout_s=1, console=Console(file=said), real_model=True)
    assert said.getvalue() == ""  # no redis-server, no fake server, no worker was started


def test_the_demo_summary_has_the_figures_of_each_stage_and_what_baton_measured() -> None:
    stages = {name: StageRecord(status=StageStatus.DONE, attempts=1) for name in ("fix", "pr")}
    run = RunRecord(
        id="20261130-225200-4f1c2a", pipeline="fixer", repo="/r", commit="c",
        issue=Issue(source=IssueSource.TEXT, title="t"), idempotency_key="k",
        status=RunStatus.DONE, stages=stages,
    )  # fmt: skip
    outputs = {
        "fix": {"tests_after": {"command": "make test", "exit_code": 0, "passed": 5, "failed": 0}},
        "pr": {"branch": "baton/20261130-225200-4f1c2a", "commit": "abc"},
    }

    summary = demo_summary(run, outputs)

    assert summary["stages"]["fix"]["tests_after"] == {"exit_code": 0, "passed": 5, "failed": 0}
    assert summary["stages"]["pr"]["branch"] == "baton/20261130-225200-4f1c2a"
    assert summary["stages"]["pr"]["attempts"] == 1 and "commit" not in summary["stages"]["pr"]
