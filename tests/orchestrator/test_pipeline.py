from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from orchestrator.core.errors import PipelineError
from orchestrator.core.pipeline import Pipeline, load_pipeline, render
from orchestrator.core.rules import PublishRule
from tests.twin import FIXER_SPEC, Names

FIXER_SCHEMAS = "orchestrator.pipelines.fixer.schemas"
REPRODUCE = {"command_from": "test_command", "test_files_from": "test_files",
             "expected_failure_from": "expected_failure"}  # fmt: skip
CODE_TOOLS = ["read_file", "edit_file"]


def test_fixer_pipeline_has_seven_stages_each_on_its_own_queue() -> None:
    pipeline = load_pipeline("fixer")
    names = ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]
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
        "review": ["issue", "reproduce", "fix", "change"],
        "pr": ["triage", "fix"],
    }


def test_triage_can_end_a_run_as_not_actionable(names: Names) -> None:
    rule = load_pipeline(names.pipeline).stage(names.stage("triage")).stop_when
    assert rule is not None

    def triage(output: dict[str, object]) -> dict[str, object]:
        return names.output("triage", output)

    assert rule.matches(triage({"actionable": False, "reason": "a browser extension"}))
    assert not rule.matches(triage({"actionable": True}))
    if names.id == "twin":
        assert not rule.matches({"actionable": False})  # the rule reads its pipeline's names
    assert (
        rule.reason(triage({"actionable": False, "reason": "a browser extension"}))
        == "a browser extension"
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
        "output_schema": f"{FIXER_SCHEMAS}:Plan",
    }
    stage.update(stage_overrides)
    return {"name": "p", "stages": [stage]}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"instruction": "use {later}"}, "references {later}"),
        ({"output_schema": f"{FIXER_SCHEMAS}:Nope"}, "cannot be imported"),
        ({"output_schema": "orchestrator.schemas:Plan"},
         "the module orchestrator.schemas is gone; write "
         "orchestrator.pipelines.fixer.schemas:Plan"),
        ({"output_schema": "orchestrator.core.schemas:Summary"},
         "the module orchestrator.core.schemas is gone; write "
         "orchestrator.pipelines.schemas:Summary"),
        ({"budget": {"soft_time_limit_s": 10, "time_limit_s": 5}}, "soft_time_limit_s"),
        ({"name": "Bad Name"}, "name"),
        ({"publish": {"planned_from": "plan.files_to_change"}},
         "publish.planned_from names 'plan', which is no earlier stage's output key"),
        ({"instruction": "again: {previous_attempt?}"}, "only a stage with a `loop` has"),
        ({"loop": {"until": "verdict.passed"}}, "loop.until names 'verdict.passed', but the "
         "output schema orchestrator.pipelines.fixer.schemas:Plan has no field 'verdict'"),
        ({"loop": {"until": "summary", "max_iterations": 11}}, "max_iterations"),
        ({"reproduce": True}, "`reproduce` names the output fields Baton reads"),
        ({"output_schema": f"{FIXER_SCHEMAS}:Reproduction", "reproduce": REPRODUCE},
         "reproduces, so it needs code tools"),
        ({"proof": {"reproduction_from": "triage"}},
         "proves with 'triage', which names no earlier stage with a `reproduce` rule"),
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


def _two_stages(first: str, **second: object) -> dict[str, object]:
    """A pipeline of an upstream stage with output schema `first` (a fixer class) and a second
    stage (a fixer `Fix` unless `second` says otherwise)."""
    upstream = {"name": "up", "instruction": "{issue}", "output_schema": f"{FIXER_SCHEMAS}:{first}",
                "tools": CODE_TOOLS}  # fmt: skip
    if first == "Reproduction":
        upstream["reproduce"] = REPRODUCE
    stage = {"name": "down", "instruction": "{up}", "output_schema": f"{FIXER_SCHEMAS}:Fix",
             "tools": CODE_TOOLS, **second}  # fmt: skip
    return {"name": "p", "stages": [upstream, stage]}


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (_two_stages("Plan", verify={"command_from": "up.test_comand"}),
         "stage 'down': verify.command_from names 'up.test_comand', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Plan has no field 'test_comand'"),
        (_two_stages("Plan", verify={"command_from": "up.steps"}),
         "verify.command_from names 'up.steps', which must hold a string, not list[str]"),
        (_two_stages("Plan", publish={"planned_from": ["up.files_to_change", "up.approach"]}),
         "publish.planned_from names 'up.approach', which must hold a list of strings, not str"),
        (_two_stages("Plan", publish={"planned_from": "up.files"}),
         "publish.planned_from names 'up.files', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Plan has no field 'files'"),
        (_two_stages("Plan", output_schema=f"{FIXER_SCHEMAS}:Triage",
                     stop_when={"field": "actionabel", "equals": False}),
         "stage 'down': stop_when.field names 'actionabel', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Triage has no field 'actionabel'"),
        (_two_stages("Plan", output_schema=f"{FIXER_SCHEMAS}:Triage",
                     stop_when={"field": "actionable", "equals": False, "reason_field": "why"}),
         "stop_when.reason_field names 'why', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Triage has no field 'why'"),
        (_two_stages("Plan", output_schema=f"{FIXER_SCHEMAS}:Reproduction",
                     reproduce={**REPRODUCE, "test_files_from": "files"}),
         "stage 'down': reproduce.test_files_from names 'files', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Reproduction has no field 'files'"),
        (_two_stages("Plan", output_schema=f"{FIXER_SCHEMAS}:Plan",
                     reproduce={"command_from": "test_command",
                                "test_files_from": "files_to_change",
                                "expected_failure_from": "approach"}),
         "stage 'down' reproduces, but its output schema "
         "'orchestrator.pipelines.fixer.schemas:Plan' has no field for what Baton measures "
         "(`Measured(Fact.REPRODUCED)`)"),
        (_two_stages("Reproduction", output_schema=f"{FIXER_SCHEMAS}:Plan",
                     proof={"reproduction_from": "up"}),
         "stage 'down' has a proof, but its output schema "
         "'orchestrator.pipelines.fixer.schemas:Plan' has no field for what Baton measures "
         "(`Measured(Fact.PROOF)`)"),
        (_two_stages("Plan", loop={"until": "proof.passd"}),
         "stage 'down': loop.until names 'proof.passd', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Fix (Proof) has no field 'passd'"),
        (_two_stages("Plan", loop={"until": "summary"}),
         "loop.until names 'summary', which must hold a boolean, not str"),
        (_two_stages("Plan", loop={"until": "proof.passed", "summary_from": "summry"}),
         "loop.summary_from names 'summry', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Fix has no field 'summry'"),
    ],
    ids=["verify-missing", "verify-not-text", "publish-not-list", "publish-missing",
         "stop-missing", "stop-reason-missing", "reproduce-missing", "reproduce-unmeasured",
         "proof-unmeasured", "loop-nested-missing", "loop-not-flag", "loop-summary-missing"],
)  # fmt: skip
def test_a_rule_naming_a_field_its_schema_lacks_is_refused_naming_stage_and_field(
    pipeline: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Pipeline.model_validate(pipeline)


def test_a_spec_file_naming_a_missing_field_is_refused_naming_the_file(
    twin: Names, tmp_path: Path
) -> None:
    """The twin's spec with one of its rules' fields spelled as the fixer spells it."""
    spec = Path(twin.pipeline).read_text()
    command = f'command_from = "{twin.stage("plan")}.{twin.field("test_command")}"'
    assert command in spec
    broken = tmp_path / "broken.toml"
    broken.write_text(spec.replace(command, f'command_from = "{twin.stage("plan")}.test_command"'))

    with pytest.raises(PipelineError) as refused:
        load_pipeline(str(broken))

    said = str(refused.value)
    assert said.startswith(f"{broken} is invalid")
    assert (
        f"stage {twin.stage('fix')!r}: verify.command_from names "
        f"'{twin.stage('plan')}.test_command', but the output schema fixer_twin_schemas:Plan has "
        "no field 'test_command'"
    ) in said


def test_the_twin_shares_no_stage_and_no_field_name_with_the_fixer(twin: Names) -> None:
    """The renamed twin the stage features' tests run over (tests/twin.py) is renamed through:
    the spec's stages, output keys, schemas' fields and the fields its rules name."""
    fixer, renamed = load_pipeline("fixer"), load_pipeline(twin.pipeline)
    assert len(renamed.stages) == len(fixer.stages)
    assert not {s.name for s in fixer.stages} & {s.name for s in renamed.stages}
    assert not {s.output_key for s in fixer.stages} & {s.output_key for s in renamed.stages}
    for ours, theirs in zip(fixer.stages, renamed.stages, strict=True):
        fields, twin_fields = ours.schema_class().model_fields, theirs.schema_class().model_fields
        assert [twin.field(name) for name in fields] == list(twin_fields)
        assert not set(fields) & set(twin_fields)
        assert ours.tools == theirs.tools and ours.budget == theirs.budget
        said = (ours.stop_when, ours.verify, ours.proof, ours.loop, ours.reproduce, ours.publish)
        told = (theirs.stop_when, theirs.verify, theirs.proof, theirs.loop, theirs.reproduce,
                theirs.publish)  # fmt: skip
        assert [rule is None for rule in said] == [rule is None for rule in told]
        assert all(a == b for a, b in zip(said, told, strict=True) if a in (None, PublishRule()))
        assert all(
            a != b for a, b in zip(said, told, strict=True) if a not in (None, PublishRule())
        )


def test_unknown_pipeline_names_the_installed_ones() -> None:
    with pytest.raises(PipelineError, match=r"entry points of baton.pipelines: fixer"):
        load_pipeline("nope")


def test_pipeline_loads_from_a_toml_file(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n[[stages]]\nname = "only"\ninstruction = "x {issue}"\n'
        'output_schema = "orchestrator.pipelines.fixer.schemas:Plan"\nqueue = "baton.custom"\n'
        '[[stages]]\nname = "next"\ninstruction = "y {only}"\n'
        'output_schema = "orchestrator.pipelines.fixer.schemas:Plan"\n'
    )
    pipeline = load_pipeline(str(path))
    assert [s.queue for s in pipeline.stages] == ["baton.custom", "baton.mine.next"]
    assert pipeline.first.output_key == "only"


def test_compaction_is_off_unless_a_stage_sets_it(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n'
        '[[stages]]\nname = "one"\ninstruction = "x {issue}"\n'
        'output_schema = "orchestrator.pipelines.fixer.schemas:Plan"\n'
        '[[stages]]\nname = "two"\ninstruction = "y {one}"\n'
        'output_schema = "orchestrator.pipelines.fixer.schemas:Plan"\n'
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
        'output_schema = "orchestrator.pipelines.fixer.schemas:Plan"\n'
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


def test_the_fixer_reproduces_first_then_loops_fix_until_proven(names: Names) -> None:
    pipeline = load_pipeline(names.pipeline)
    fix = pipeline.stage(names.stage("fix"))

    def out(output: dict[str, object]) -> dict[str, object]:
        return names.output("fix", output)

    assert pipeline.stage(names.stage("reproduce")).reproduce
    assert fix.proof is not None and fix.proof.reproduction_from == names.stage("reproduce")
    assert fix.loop is not None
    until = f"{names.field('proof')}.passed"
    assert (fix.loop.until, fix.loop.max_iterations) == (until, 3)
    assert fix.loop.holds(out({"proof": {"passed": True}}))
    assert not fix.loop.holds(out({"proof": {"passed": "yes"}}))  # true, not truthy
    assert not fix.loop.holds(out({"summary": "no proof"}))
    said = out({"proof": {"passed": False, "reason": "2 still fail"}, "summary": "s"})
    assert (fix.loop.reason(said), fix.loop.summary(said)) == ("2 still fail", "s")
    assert fix.loop.reason({}) == f"{until} was not true"


@pytest.mark.parametrize("publisher", ["nowhere", "up"], ids=["no such stage", "not publishing"])
def test_a_proof_publishable_by_names_a_later_stage_that_publishes(publisher: str) -> None:
    spec = _two_stages("Reproduction", proof={"reproduction_from": "up",
                                              "publishable_by": publisher})  # fmt: skip

    said = f"proves its change publishable by '{publisher}', which names no later stage with"
    with pytest.raises(ValueError, match=said):
        Pipeline.model_validate(spec)
    pr = {"name": "pr", "instruction": "{down}", "output_schema": f"{FIXER_SCHEMAS}:PullRequest",
          "tools": ["show_diff", "publish"]}  # fmt: skip
    spec["stages"].append(pr)  # type: ignore[attr-defined]
    spec["stages"][1]["proof"]["publishable_by"] = "pr"  # type: ignore[index]
    assert Pipeline.model_validate(spec).stage("down").proof.publishable_by == "pr"  # type: ignore[union-attr]


def _fixer_with_review(send_back: dict[str, object]) -> dict[str, object]:
    spec = tomllib.loads(FIXER_SPEC.read_text())
    review = next(stage for stage in spec["stages"] if stage["name"] == "review")
    review["send_back"] = send_back
    return spec


@pytest.mark.parametrize(
    ("send_back", "said"),
    [
        ({"to": "plan", "unless": "fixes_cause"},
         "send_back.to names 'plan', which names no earlier stage with a `loop`"),
        ({"to": "pr", "unless": "fixes_cause"},
         "send_back.to names 'pr', which names no earlier stage with a `loop`"),
        ({"to": "fix", "unless": "approved"},
         "send_back.unless names 'approved', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Review has no field 'approved'"),
        ({"to": "fix", "unless": "problems"},
         "send_back.unless names 'problems', which must hold a boolean, not list[str]"),
        ({"to": "fix", "unless": "fixes_cause", "reason_from": "why"},
         "send_back.reason_from names 'why', but the output schema"),
    ],
    ids=["not looped", "not earlier", "no such field", "not a flag", "no reason field"],
)  # fmt: skip
def test_a_send_back_names_an_earlier_looped_stage_and_flags_of_its_own_output(
    send_back: dict[str, object], said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        Pipeline.model_validate(_fixer_with_review(send_back))


def test_a_send_back_holds_only_when_every_flag_is_true_and_says_what_is_wrong() -> None:
    rule = load_pipeline("fixer").stage("review").send_back
    assert rule is not None and rule.to == "fix" and rule.then == "loop"

    assert rule.holds({"reproduces_report": True, "fixes_cause": True, "problems": ["a nit"]})
    assert not rule.holds({"reproduces_report": True, "fixes_cause": "yes"})  # true, not truthy
    assert not rule.holds({"fixes_cause": True})
    said = {"reproduces_report": False, "fixes_cause": True, "problems": [" wrong test ", ""]}
    assert rule.reason(said) == "wrong test"
    assert rule.reason({"reproduces_report": True, "fixes_cause": False, "problems": []}) == (
        "fixes_cause not true"
    )


def test_a_review_reads_the_change_its_run_made_so_a_fixer_run_needs_no_base() -> None:
    spec = _fixer_with_review({"to": "fix", "unless": "fixes_cause"})
    assert not Pipeline.model_validate(spec).reads_change
    first = spec["stages"][0]  # type: ignore[index]
    first["instruction"] += "\n{change}"
    assert Pipeline.model_validate(spec).reads_change  # read before any stage made one
