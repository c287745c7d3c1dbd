from __future__ import annotations

import pytest

from orchestrator.core.errors import PipelineError
from orchestrator.core.pipeline import Pipeline, load_pipeline, render


def test_fixer_pipeline_has_six_stages_each_on_its_own_queue() -> None:
    pipeline = load_pipeline("fixer")
    names = ["triage", "search", "plan", "reproduce", "fix", "pr"]
    assert [s.name for s in pipeline.stages] == names
    assert [s.queue for s in pipeline.stages] == [f"baton.fixer.{name}" for name in names]


def test_fixer_stages_reference_only_what_they_need() -> None:
    pipeline = load_pipeline("fixer")
    assert {s.name: s.inputs for s in pipeline.stages} == {
        "triage": ["issue"],
        "search": ["triage", "issue"],
        "plan": ["triage", "search"],
        "reproduce": ["plan", "issue"],
        "fix": ["plan", "search", "reproduce", "previous_attempt"],
        "pr": ["triage", "fix"],
    }


def test_triage_can_end_a_run_as_not_actionable() -> None:
    rule = load_pipeline("fixer").stage("triage").stop_when
    assert rule is not None
    assert rule.matches({"actionable": False, "reason": "a browser extension"})
    assert not rule.matches({"actionable": True})
    assert (
        rule.reason({"actionable": False, "reason": "a browser extension"}) == "a browser extension"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("def f(): return {item}", "<def f(): return {item}>"),
        ("{{diff}} ${x} {x}", "<{{diff}} ${x} {x}>"),
        ('{"a": 1}', '<{"a": 1}>'),
    ],
)
def test_braces_inside_values_are_never_templated(value: str, expected: str) -> None:
    assert render("<{code}>", {"code": value, "item": "NO", "diff": "NO", "x": "NO"}) == expected


def test_template_braces_escape_and_optional_keys() -> None:
    assert render("{{literal}} {a} {b?} {c}", {"a": 1, "c": {"k": "v"}}) == (
        '{literal} 1  {\n "k": "v"\n}'
    )


def test_missing_required_value_raises_key_error() -> None:
    with pytest.raises(KeyError):
        render("{a}", {})


def _pipeline(**stage_overrides: object) -> dict[str, object]:
    stage = {
        "name": "one",
        "instruction": "go {issue}",
        "output_schema": "orchestrator.core.schemas:Plan",
    }
    stage.update(stage_overrides)
    return {"name": "p", "stages": [stage]}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"instruction": "use {later}"}, "references {later}"),
        ({"output_schema": "orchestrator.core.schemas:Nope"}, "cannot be imported"),
        ({"output_schema": "orchestrator.schemas:Plan"},
         "the module orchestrator.schemas is now orchestrator.core.schemas; "
         "write orchestrator.core.schemas:Plan"),
        ({"budget": {"soft_time_limit_s": 10, "time_limit_s": 5}}, "soft_time_limit_s"),
        ({"name": "Bad Name"}, "name"),
        ({"publish": {"planned_from": "plan.files_to_change"}},
         "takes its planned files from 'plan', which names no earlier stage"),
        ({"instruction": "again: {previous_attempt?}"}, "only a stage with a `loop` has"),
        ({"loop": {"until": "verdict.passed"}}, "has no field 'verdict'"),
        ({"loop": {"until": "summary", "max_iterations": 11}}, "max_iterations"),
        ({"reproduce": True}, "its output schema must be a Reproduction"),
        ({"output_schema": "orchestrator.core.schemas:Reproduction", "reproduce": True},
         "reproduces, so it needs code tools"),
        ({"proof": {"reproduction_from": "triage"}},
         "proves with 'triage', which names no earlier stage with `reproduce = true`"),
        ({"publish": {"allow": ["workflows"]}}, "publish.allow.0"),
        ({"compaction": {"trigger_tokens": 13_000}},
         r"stage 'one': compaction.trigger_tokens \(13000\) is above budget.max_request_tokens "
         r"\(12000\)"),
        ({"compaction": {"max_summary_tokens": 7_000}},
         r"stage 'one': compaction.max_summary_tokens \(7000\) is more than half"),
        ({"compaction": {"overlap": 0}}, "compaction.overlap"),
        ({"compaction": {"interval": 3}}, "compaction.interval"),
        ({"compaction": {"model": "gemini flash?"}}, "compaction.model"),
    ],
)  # fmt: skip
def test_invalid_pipelines_are_refused_with_the_reason(
    override: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Pipeline.model_validate(_pipeline(**override))


def test_unknown_pipeline_names_the_installed_ones() -> None:
    with pytest.raises(PipelineError, match=r"entry points of baton.pipelines: fixer"):
        load_pipeline("nope")


def test_pipeline_loads_from_a_toml_file(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n[[stages]]\nname = "only"\ninstruction = "x {issue}"\n'
        'output_schema = "orchestrator.core.schemas:Plan"\nqueue = "baton.custom"\n'
        '[[stages]]\nname = "next"\ninstruction = "y {only}"\n'
        'output_schema = "orchestrator.core.schemas:Plan"\n'
    )
    pipeline = load_pipeline(str(path))
    assert [s.queue for s in pipeline.stages] == ["baton.custom", "baton.mine.next"]
    assert pipeline.first.output_key == "only"


def test_compaction_is_off_unless_a_stage_sets_it(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n'
        '[[stages]]\nname = "one"\ninstruction = "x {issue}"\n'
        'output_schema = "orchestrator.core.schemas:Plan"\n'
        '[[stages]]\nname = "two"\ninstruction = "y {one}"\n'
        'output_schema = "orchestrator.core.schemas:Plan"\n'
        'compaction = { overlap = 3, model = "gemini-2.5-flash-lite" }\n'
    )
    one, two = load_pipeline(str(path)).stages
    assert one.compaction is None
    assert two.compaction is not None
    assert (two.compaction.overlap, two.compaction.model) == (3, "gemini-2.5-flash-lite")
    assert (two.compaction.trigger_tokens, two.compaction.max_summary_tokens) == (None, 1_000)
    assert all(stage.compaction is None for stage in load_pipeline("fixer").stages)


@pytest.mark.parametrize("queue", ["custom", "celery", "baton:run:x", "baton."])
def test_a_queue_outside_batons_names_is_refused(tmp_path, queue: str) -> None:
    """The Redis users may touch only `baton.*` lists, and the reconciler looks only there."""
    path = tmp_path / "mine.toml"
    path.write_text(
        f'name = "mine"\n[[stages]]\nname = "only"\ninstruction = "x"\nqueue = "{queue}"\n'
        'output_schema = "orchestrator.core.schemas:Plan"\n'
    )
    with pytest.raises(PipelineError, match=r"stages\.0\.queue"):
        load_pipeline(str(path))


@pytest.mark.parametrize("name", ["Fixer", "my.pipe", "", "a b", "-x", "build"])
def test_a_pipeline_name_that_cannot_name_a_queue_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        Pipeline.model_validate({**_pipeline(), "name": name})


def test_time_limits_must_stay_below_the_visibility_timeout() -> None:
    from orchestrator.core.errors import ConfigError
    from orchestrator.core.queue import check_time_limits
    from orchestrator.core.settings import QueueConfig, RetryConfig

    pipeline = load_pipeline("fixer")
    check_time_limits(pipeline, QueueConfig(), RetryConfig())
    with pytest.raises(
        ConfigError, match=r"stage 'triage': time_limit_s 600 \+ rate_limit_max_wait_s 900"
    ):
        check_time_limits(pipeline, QueueConfig(visibility_timeout_s=1200), RetryConfig())


@pytest.mark.parametrize("network", ["host", "container:abc", "none", "bad name"])
def test_a_stage_cannot_opt_its_sandbox_into_the_hosts_network(network: str) -> None:
    with pytest.raises(ValueError, match="sandbox_network"):
        Pipeline.model_validate(_pipeline(tools=["read_file"], sandbox_network=network))


def test_a_stage_may_opt_its_sandbox_into_a_named_network() -> None:
    pipeline = Pipeline.model_validate(
        _pipeline(tools=["read_file"], sandbox_network="egress-proxy")
    )
    assert pipeline.first.sandbox_network == "egress-proxy"


def test_the_stages_before_one_come_nearest_first() -> None:
    pipeline = load_pipeline("fixer")

    assert [s.name for s in pipeline.before("fix")] == ["reproduce", "plan", "search", "triage"]
    assert pipeline.before("triage") == ()
    assert pipeline.next_after("fix") is not None and pipeline.next_after("pr") is None


def test_the_fixer_publishes_only_planned_files_and_no_special_class() -> None:
    pr = load_pipeline("fixer").stage("pr")
    planned = ("plan.files_to_change", "reproduce.test_files")  # the fix and its test
    assert (pr.publish.planned_from, pr.publish.allow) == (planned, ())


def test_the_fixer_reproduces_first_then_loops_fix_until_proven() -> None:
    pipeline = load_pipeline("fixer")
    fix = pipeline.stage("fix")
    assert pipeline.stage("reproduce").reproduce
    assert fix.proof is not None and fix.proof.reproduction_from == "reproduce"
    assert fix.loop is not None
    assert (fix.loop.until, fix.loop.max_iterations) == ("proof.passed", 3)
    assert fix.loop.holds({"proof": {"passed": True}})
    assert not fix.loop.holds({"proof": {"passed": "yes"}})  # true, not truthy
    assert not fix.loop.holds({"summary": "no proof"})
    assert fix.loop.reason({"proof": {"passed": False, "reason": "2 still fail"}}) == "2 still fail"
    assert fix.loop.reason({}) == "proof.passed was not true"
