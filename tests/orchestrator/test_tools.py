"""Declared tools in a pipeline spec: what loads, and what is refused (naming the file, the
stage and the tool) when the pipeline loads, when it is checked, and at enqueue."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control import api
from orchestrator.core.errors import PipelineError
from orchestrator.core.hostfunction import host_signature
from orchestrator.core.pipeline import Pipeline, load_pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.toolcheck import ToolProblem, check_tools
from orchestrator.core.tools import CommandTool, HostTool, McpServer

SAMPLE = "tests.workers.sample_tools"

GOOD = f"""
name = "labeller"

[tools.lookup_owner]
kind = "host"
function = "{SAMPLE}:lookup_owner"
settings = {{ region = "eu" }}
secrets = {{ token = "OWNERS_TOKEN" }}

[tools.grep_for]
kind = "command"
description = "Search the repository for a fixed string."
command = ["grep", "-rnF", "--", "{{pattern}}", "."]
env = {{ GREP_COLORS = "{{colors}}", LC_ALL = "C" }}
args.pattern = {{ description = "The text to find." }}
args.colors = {{ description = "grep's colours.", default = "" }}

[tools.notes]
kind = "mcp"
command = ["python3", "-m", "notes_server"]
tools = ["get_note"]

[[stages]]
name = "label"
output_schema = "orchestrator.pipelines.fixer.schemas:Triage"
instruction = "Label {{issue}}"
tools = ["read_file", "lookup_owner", "grep_for", "notes"]
"""


def write(tmp_path: Path, text: str, name: str = "labeller.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec(tools: str, stage_tools: list[str], *, stages: int = 1) -> str:
    """A pipeline with the `[tools.*]` tables `tools` and `stages` stages naming `stage_tools`."""
    stage = """
[[stages]]
name = "{name}"
output_schema = "orchestrator.pipelines.fixer.schemas:Triage"
instruction = "Go {{issue}}"
tools = {tools}
"""
    body = "".join(
        stage.format(name=f"stage{n}", tools=json.dumps(stage_tools)) for n in range(1, stages + 1)
    )
    return f'name = "p"\n{tools}\n{body}'


def test_a_pipeline_declares_a_host_a_command_and_an_mcp_tool(tmp_path: Path) -> None:
    pipeline = load_pipeline(str(write(tmp_path, GOOD)))

    host, command, server = (pipeline.tools[n] for n in ("lookup_owner", "grep_for", "notes"))
    assert isinstance(host, HostTool) and isinstance(command, CommandTool)
    assert isinstance(server, McpServer)
    assert (host.secrets, host.settings, host.timeout_s) == (
        {"token": "OWNERS_TOKEN"},
        {"region": "eu"},
        60.0,
    )
    assert command.command == ("grep", "-rnF", "--", "{pattern}", ".")
    assert command.args["colors"].default == ""
    assert (server.command, server.tools, server.url) == (
        ("python3", "-m", "notes_server"),
        ("get_note",),
        "",
    )
    assert pipeline.stage("label").tools == ("read_file", "lookup_owner", "grep_for", "notes")
    assert check_tools(pipeline) == []


def test_the_model_sees_only_the_parameters_it_fills() -> None:
    declaration = HostTool(
        kind="host", function=f"{SAMPLE}:lookup_owner", settings={"region": "eu"},
        secrets={"token": "OWNERS_TOKEN"},
    )  # fmt: skip

    signature = host_signature(declaration)

    assert [(p.name, p.annotation) for p in signature.parameters] == [("path", str), ("team", str)]
    assert signature.settings == {"region": "eu"}
    assert signature.secrets == {"token": "OWNERS_TOKEN"}
    assert signature.description.startswith("The team that owns a file of the repository")
    assert signature.model_client is None


def test_a_tool_model_parameter_is_baton_s_to_fill() -> None:
    signature = host_signature(HostTool(kind="host", function=f"{SAMPLE}:summarize"))

    assert signature.model_client == "model"
    assert [p.name for p in signature.parameters] == ["text", "style"]


def test_the_run_and_the_environment_s_variables_are_baton_s_to_fill() -> None:
    declaration = HostTool(
        kind="host", function=f"{SAMPLE}:where_am_i",
        environment={"region": "OWNERS_REGION", "api_url": "OWNERS_URL"},
    )  # fmt: skip

    signature = host_signature(declaration)

    assert [p.name for p in signature.parameters] == ["question"]
    assert signature.run == "run"
    assert signature.environment == {"region": "OWNERS_REGION", "api_url": "OWNERS_URL"}
    assert signature.required_environment == {"region"}  # api_url has a default


HOST = '[tools.t]\nkind = "host"\nfunction = "{function}"\n{extra}\n'


@pytest.mark.parametrize(
    ("function", "extra", "field", "message"),
    [
        ("nowhere.at_all:f", "", "tools.t.function",
         "'nowhere.at_all:f' cannot be imported: No module named 'nowhere'"),
        (f"{SAMPLE}:missing", "", "tools.t.function", f"module '{SAMPLE}' has no 'missing'"),
        (f"{SAMPLE}:NOT_A_FUNCTION", "", "tools.t.function", "is not a function (def or async"),
        (f"{SAMPLE}:untyped", "", "tools.t.function", "parameter 'path' has no type annotation"),
        (f"{SAMPLE}:no_return", "", "tools.t.function", "has no return annotation"),
        (f"{SAMPLE}:star", "", "tools.t.function", "parameter 'paths' must be a named one"),
        (f"{SAMPLE}:undocumented", "", "tools.t.description", "the function has no docstring"),
        (f"{SAMPLE}:with_context", "", "tools.t.function", "parameter 'tool_context' is reserved"),
        (f"{SAMPLE}:generator", "", "tools.t.function", "is a generator"),
        (f"{SAMPLE}:lookup_owner",
         'secrets = { token = "T", key = "K" }\nsettings = { region = "eu" }',
         "tools.t.secrets.key", "names parameter 'key', which"),
        (f"{SAMPLE}:lookup_owner", 'secrets = { token = "T" }\nsettings = { region = 3 }',
         "tools.t.settings.region", "3 does not fit the parameter's type"),
        (f"{SAMPLE}:nap", 'secrets = { seconds = "T" }',
         "tools.t.secrets.seconds", "holds a secret, so it is annotated `str` or `SecretStr`"),
        (f"{SAMPLE}:nap", 'environment = { seconds = "NAP_S" }', "tools.t.environment.seconds",
         "is filled from an environment variable, so it is annotated `str`"),
        (f"{SAMPLE}:where_am_i", 'environment = { region = "R", zone = "Z" }',
         "tools.t.environment.zone", "names parameter 'zone', which"),
        (f"{SAMPLE}:where_am_i", 'environment = { region = "R" }\nsecrets = { region = "S" }',
         "tools.t.environment.region", "is also given in settings or secrets"),
    ],
)  # fmt: skip
def test_a_host_tool_that_cannot_run_is_refused_naming_file_stage_and_tool(
    tmp_path: Path, function: str, extra: str, field: str, message: str
) -> None:
    path = write(tmp_path, spec(HOST.format(function=function, extra=extra), ["t"]))

    with pytest.raises(PipelineError) as raised:
        load_pipeline(str(path))

    assert f"{path}: stage 'stage1', tool 't' ({field}): " in str(raised.value)
    assert message in str(raised.value)


COMMAND = """[tools.t]
kind = "command"
description = "A command."
command = {command}
env = {env}
args.path = {{ description = "A path." }}
args.count = {{ type = "integer", description = "How many.", default = 3 }}
"""


@pytest.mark.parametrize(
    ("command", "env", "field", "message"),
    [
        (["cat", "--file={path}", "{count}"], {}, "command[1]",
         "'--file={path}' splices into a string"),
        (["cat", "{path}{count}"], {}, "command[1]", "'{path}{count}' splices into a string"),
        (["cat", "pre {path}", "{count}"], {}, "command[1]", "'pre {path}' splices into a string"),
        (["cat", "{path}", "{count", "x"], {}, "command[2]", "'{count' splices into a string"),
        (["{path}", "{count}"], {}, "command[0]", "the program is not the model's to choose"),
        (["cat", "{path}", "{lines}", "{count}"], {}, "command[2]",
         "names {lines}, which `args` does not declare"),
        (["cat", "{path}"], {}, "args.count",
         "is declared, but neither `command` nor `env` passes it"),
        (["cat", "{count}"], {"FILE": "x{path}"}, "env.FILE", "'x{path}' splices into a string"),
        (["cat", "{count}"], {"LD_PRELOAD": "{path}"}, "env.LD_PRELOAD", "decides what code runs"),
        (["cat", "{count}"], {"PATH": "{path}"}, "env.PATH", "decides what code runs"),
    ],
)  # fmt: skip
def test_a_command_template_that_splices_is_refused(
    tmp_path: Path, command: list[str], env: dict[str, str], field: str, message: str
) -> None:
    tables = COMMAND.format(command=json.dumps(command), env=_inline(env))
    path = write(tmp_path, spec(tables, ["t"]))

    with pytest.raises(PipelineError) as raised:
        load_pipeline(str(path))

    assert f"{path}: stage 'stage1', tool 't' (tools.t.{field}): {message}" in str(raised.value)


def test_literal_braces_are_written_doubled(tmp_path: Path) -> None:
    tables = COMMAND.format(
        command=json.dumps(["find", ".", "-name", "{path}", "-exec", "wc", "{{}}", "{count}"]),
        env="{}",
    )
    pipeline = load_pipeline(str(write(tmp_path, spec(tables, ["t"]))))

    assert check_tools(pipeline) == []


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ('command = ["srv"]\nurl = "http://127.0.0.1:1/mcp"', "tools.t",
         "give exactly one of `command`"),
        ("", "tools.t", "give exactly one of `command`"),
        ('url = "ftp://example.com/mcp"', "tools.t.url", "is not an http:// or https:// URL"),
        ('url = "http://127.0.0.1:1/mcp"\nenv = { A = "b" }', "tools.t.env",
         "is for a stdio server"),
        ('command = ["srv"]\nsecrets = { "bad name" = "TOKEN" }', "tools.t.secrets.bad name",
         "is not a variable name"),
    ],
)  # fmt: skip
def test_an_mcp_server_without_one_address_is_refused(
    tmp_path: Path, table: str, field: str, message: str
) -> None:
    tables = f'[tools.t]\nkind = "mcp"\ntools = ["get_note"]\n{table}\n'
    path = write(tmp_path, spec(tables, ["t"]))

    with pytest.raises(PipelineError) as raised:
        load_pipeline(str(path))

    assert f"{path}: stage 'stage1', tool 't' ({field}): {message}" in str(raised.value)


def test_an_undeclared_tool_is_refused_naming_the_stage_and_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, spec("", ["read_file", "lookup"], stages=2))

    with pytest.raises(PipelineError) as raised:
        load_pipeline(str(path))

    lines = str(raised.value).splitlines()
    assert lines[0] == f"{path} is invalid: its tools cannot run:"
    assert lines[1].startswith(f"{path}: stage 'stage1', tool 'lookup' (stages[0].tools[1]): "
                               "is neither a built-in tool (list_files, ")  # fmt: skip
    assert lines[1].endswith("nor declared in a [tools.lookup] table (declared: none)")
    assert lines[2].startswith(f"{path}: stage 'stage2', tool 'lookup' (stages[1].tools[1]): ")
    assert len(lines) == 3


def test_a_declared_tool_may_not_shadow_a_built_in_or_offer_a_name_twice(tmp_path: Path) -> None:
    tables = (
        f'[tools.read_file]\nkind = "host"\nfunction = "{SAMPLE}:owner_model"\n'
        '[tools.notes]\nkind = "mcp"\ncommand = ["srv"]\ntools = ["list_files", "get_note"]\n'
    )
    pipeline = Pipeline.model_validate(
        tomllib.loads(spec(tables, ["read_file", "list_files", "notes"]))
    )

    assert [str(problem) for problem in check_tools(pipeline)] == [
        "stage 'stage1', tool 'read_file' (tools.read_file): is the name of a built-in tool; "
        "give the declared one another name",
        "stage 'stage1', tool 'notes' (stages[0].tools[2]): offers the model a tool named "
        "'list_files', as 'list_files' does",
    ]


def test_a_problem_of_a_declaration_no_stage_uses_names_the_tool() -> None:
    problem = ToolProblem("t", "is wrong", (), "tools.t")

    assert problem.describe("p.toml") == "p.toml: tool 't' (tools.t): is wrong"
    assert str(ToolProblem("t", "x", ("a", "b"))) == "stages 'a', 'b', tool 't': x"


def test_an_unknown_kind_is_refused_by_the_schema(tmp_path: Path) -> None:
    path = write(tmp_path, spec('[tools.t]\nkind = "shell"\ncommand = "rm -rf /"\n', ["t"]))

    with pytest.raises(
        PipelineError,
        match=r"tools\.t\n.*'kind' does not match any of the expected tags: 'host', 'command', "
        "'mcp'",
    ):
        load_pipeline(str(path))


def test_enqueue_refuses_a_pipeline_whose_tools_cannot_run(tmp_path: Path) -> None:
    path = write(tmp_path, spec("", ["lookup"]))
    nowhere = Settings(redis_url="redis://127.0.0.1:9/0")  # never reached: refused before

    with pytest.raises(
        PipelineError, match=r"labeller\.toml, stage 'stage1', field 'tools': tool 'lookup'"
    ):
        api.enqueue("a text report", repo=str(tmp_path), pipeline=str(path), settings=nowhere)


def _inline(table: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key} = {json.dumps(value)}" for key, value in table.items()) + "}"
