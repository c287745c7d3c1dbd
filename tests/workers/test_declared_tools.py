"""The wrappers of declared tools, one kind at a time: host functions, sandbox commands (in a
working copy on this host), MCP servers (a real stdio server), and the secrets they use."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from google.adk.tools.function_tool import FunctionTool

from orchestrator.core.rules import StageBudget
from orchestrator.core.tools import CommandTool, HostTool, McpServer, ToolRun
from testkit.inprocess import InProcessGemini
from testkit.workspace import LocalWorkspace
from tests.labeller import write_notes_server
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.errors import RateLimitedError, StageCancelledError, StageError
from workers.guard import ToolGuard
from workers.tools.command import command_tool
from workers.tools.declared import ToolBench, open_toolbox
from workers.tools.errors import ToolError
from workers.tools.host import host_tool
from workers.tools.model import StageToolModel
from workers.tools.secrets import Secrets

SAMPLE = "tests.workers.sample_tools"
TOKEN = "tok-0123456789abcdef"


def host(function: str, **declared: Any) -> FunctionTool:
    declaration = HostTool(kind="host", function=f"{SAMPLE}:{function}", **declared)
    return host_tool(function, declaration, stage="label", secrets=Secrets({"TOKEN": TOKEN}))


def call(tool: FunctionTool, **args: Any) -> Any:
    return asyncio.run(tool.func(**args))


# -- secrets ----------------------------------------------------------------------------------


def test_a_secret_not_set_is_a_stage_error_naming_the_variable() -> None:
    with pytest.raises(StageError, match="tool 'lookup' of stage 'label' needs the secret TOKEN, "
                       "which is not set in the worker's environment"):  # fmt: skip
        Secrets.read(["TOKEN"], {}, tool="lookup", stage="label")


def test_a_secret_too_short_to_redact_is_refused_without_its_value() -> None:
    with pytest.raises(StageError) as raised:
        Secrets.read(["TOKEN"], {"TOKEN": "abc1"}, tool="lookup", stage="label")

    assert "the secret TOKEN of tool 'lookup' is shorter than 8 characters" in str(raised.value)
    assert "abc1" not in str(raised.value)


def test_redaction_reaches_keys_lists_and_nested_values() -> None:
    secrets = Secrets({"A": "alpha-secret", "B": "alpha-secret-longer"})

    assert secrets.redact({"alpha-secret": ["x alpha-secret-longer y", 3, None]}) == {
        "[secret A]": ["x [secret B] y", 3, None]
    }


# -- host tools -------------------------------------------------------------------------------


def test_a_host_tool_gets_its_settings_and_secret_and_returns_json_ready_data() -> None:
    tool = host("lookup_owner", settings={"region": "eu"}, secrets={"token": "TOKEN"})

    assert call(tool, path="a.py") == {
        "path": "a.py", "team": "core@eu", "auth": "Bearer [secret TOKEN]"
    }  # fmt: skip
    assert call(host("owner_model"), path="b.py") == {"team": "core", "reviewers": ["ana", "b.py"]}


def test_the_model_cannot_replace_a_bound_setting_or_secret() -> None:
    """Past the guard (which refuses such an argument), the declared values still win."""
    tool = host("lookup_owner", settings={"region": "eu"}, secrets={"token": "TOKEN"})

    answer = call(tool, path="a.py", token="chosen-by-the-model", region="us")

    assert (answer["auth"], answer["team"]) == ("Bearer [secret TOKEN]", "core@eu")


RUN = ToolRun(run_id="run-7", pipeline="labeller", stage="label", repo="/srv/git/shop",
              commit="c" * 40, source="pull_request", source_id="acme/shop#7")  # fmt: skip
WHERE = HostTool(kind="host", function=f"{SAMPLE}:where_am_i",
                 environment={"region": "OWNERS_REGION", "api_url": "OWNERS_URL"})  # fmt: skip


def where_am_i(environ: dict[str, str], run: ToolRun | None = RUN) -> FunctionTool:
    return host_tool("where_am_i", WHERE, stage="label", secrets=Secrets(), environ=environ,
                     run=run)  # fmt: skip


def test_a_host_tool_gets_the_run_and_its_variables_of_the_worker_s_environment() -> None:
    tool = where_am_i({"OWNERS_REGION": "eu", "OWNERS_URL": "https://owners.internal"})

    assert call(tool, question="who?") == {
        "question": "who?", "run": "run-7", "source_id": "acme/shop#7", "repo": "/srv/git/shop",
        "region": "eu", "api_url": "https://owners.internal",
    }  # fmt: skip


def test_a_variable_not_set_leaves_the_default_or_fails_the_stage_naming_it() -> None:
    assert call(where_am_i({"OWNERS_REGION": "eu"}), question="q")["api_url"] == (
        "https://owners.example"
    )
    with pytest.raises(StageError, match="tool 'where_am_i' of stage 'label' needs "
                       "OWNERS_REGION set in the worker's environment"):  # fmt: skip
        where_am_i({"OWNERS_URL": "https://owners.internal"})


def test_a_tool_that_asks_for_the_run_fails_the_stage_without_one() -> None:
    with pytest.raises(StageError, match="asks for the run; none is given"):
        where_am_i({"OWNERS_REGION": "eu"}, run=None)


def test_the_model_cannot_name_the_run_or_a_variable() -> None:
    tool = where_am_i({"OWNERS_REGION": "eu"})
    guard = ToolGuard([tool.name], stage="label")

    assert guard.argument_problem(tool.name, tool.func, {"question": "q", "run": {}}) == (
        "run: no such argument"
    )
    # past the guard, Baton's values still win
    answer = call(tool, question="q", run=RUN.model_copy(update={"source_id": "evil/x#1"}),
                  region="us")  # fmt: skip
    assert (answer["source_id"], answer["region"]) == ("acme/shop#7", "eu")


def test_an_exception_becomes_an_error_for_the_model_without_the_secret() -> None:
    tool = host("refuse", secrets={"token": "TOKEN"})

    assert call(tool, path="a.py") == {
        "error": "refuse failed: PermissionError: the owners service refused token [secret TOKEN]"
    }


@pytest.mark.parametrize(("function", "args"), [("nap", {"seconds": 0.6}),
                                                ("wait_forever", {"note": "n"})])  # fmt: skip
def test_a_host_tool_past_its_timeout_is_an_error_for_the_model(
    function: str, args: dict[str, Any]
) -> None:
    tool = host(function, timeout_s=0.2)

    assert call(tool, **args) == {"error": f"{function} did not finish within 0.2 s"}


def test_a_cancelled_run_is_not_a_tool_error() -> None:
    with pytest.raises(StageCancelledError):
        call(host("stopped"), path="a.py")


def test_the_guard_checks_a_host_tool_s_arguments_against_what_the_model_fills() -> None:
    tool = host("lookup_owner", settings={"region": "eu"}, secrets={"token": "TOKEN"})
    guard = ToolGuard([tool.name], stage="label")

    assert guard.argument_problem(tool.name, tool.func, {"path": "a.py"}) is None
    assert guard.argument_problem(tool.name, tool.func, {"path": "a.py", "token": "x"}) == (
        "token: no such argument"
    )
    assert guard.argument_problem(tool.name, tool.func, {"path": 3}) == (
        "path: input should be a valid string, got the number 3"
    )


def test_a_function_that_no_longer_imports_is_a_stage_error() -> None:
    with pytest.raises(StageError, match=r"tool 'gone' of stage 'label' cannot run: function: "):
        host_tool("gone", HostTool(kind="host", function="nowhere:gone"), stage="label",
                  secrets=Secrets())  # fmt: skip


def model_for(fake: InProcessGemini, usage: Usage, audit: list[dict[str, Any]]) -> Any:
    """The factory of the model a host tool asks for, over `fake`, for a stage allowed two
    model calls."""

    def make(tool: str, secrets: Secrets) -> StageToolModel:
        return StageToolModel(
            tool, model=fake.model(transient_attempts=1), usage=usage, max_model_calls=2,
            audit=audit.extend, labels={"session": "r1:label:1"}, secrets=secrets,
            loop=asyncio.get_running_loop(),
        )  # fmt: skip

    return make


def test_a_tool_s_model_calls_are_the_stage_s_and_stay_within_its_budget() -> None:
    fake = InProcessGemini({"agents": {"default": [{"text": "In short."}]}})
    usage = Usage()
    audit: list[dict[str, Any]] = []

    async def act() -> list[Any]:
        model = model_for(fake, usage, audit)("summarize", Secrets({"TOKEN": TOKEN}))
        answers: list[Any] = [await model.generate(f"Summarize the answer to {TOKEN}")]
        answers.append(await asyncio.to_thread(model.generate_sync, "Again"))
        with pytest.raises(ToolError, match="the stage has made the 2 model calls its budget "
                           "allows; summarize cannot make another"):  # fmt: skip
            await model.generate("A third time")
        with pytest.raises(RuntimeError, match="an async tool awaits generate"):
            model.generate_sync("From the loop")
        return answers

    assert asyncio.run(act()) == ["In short.", "In short."]
    assert usage.requests == 2
    assert usage.prompt_tokens_total == sum(entry["prompt_tokens"] for entry in fake.requests())
    sent = fake.requests()[0]["request"]["contents"][0]["parts"][0]["text"]
    assert sent == "Summarize the answer to [secret TOKEN]"
    assert [entry["kind"] for entry in audit] == ["tool_model_request", "model_reply"] * 2


def test_a_429_of_a_tool_s_model_call_ends_the_stage_as_its_own_would() -> None:
    fake = InProcessGemini({"agents": {"default": [{"text": "In short."}]},
                            "faults": [{"status": 429, "retry_delay_s": 7}]})  # fmt: skip
    make = model_for(fake, Usage(), [])

    async def act() -> Any:
        declaration = HostTool(kind="host", function=f"{SAMPLE}:summarize")
        tool = host_tool("summarize", declaration, stage="label", secrets=Secrets(),
                         model=lambda: make("summarize", Secrets()))  # fmt: skip
        return await tool.func(text="a text", style="short")

    with pytest.raises(RateLimitedError) as raised:
        asyncio.run(act())
    assert raised.value.delay_s == 7


# -- command tools ----------------------------------------------------------------------------

COMMAND = CommandTool(
    kind="command",
    description="Print the arguments and a variable.",
    command=(sys.executable, "-c", "import os, sys; print(sys.argv[1:], os.environ.get('MODE'))",
             "{path}", "--count", "{count}", "{{literal}}"),
    env={"MODE": "{mode}"},
    args={
        "path": {"description": "A path.", "pattern": r"[\w./$();`' -]+"},
        "count": {"type": "integer", "description": "How many.", "default": 3},
        "mode": {"description": "How.", "enum": ["fast", "slow"], "default": "fast"},
    },
)  # fmt: skip


@pytest.fixture
def commands(tmp_path: Path) -> FunctionTool:
    return command_tool("show", COMMAND, LocalWorkspace(tmp_path), timeout_s=30)


@pytest.mark.parametrize("payload", ["$(touch pwned)", "; touch pwned", "`touch pwned`"])
def test_an_argument_is_one_argv_element_whatever_it_holds(
    commands: FunctionTool, tmp_path: Path, payload: str
) -> None:
    result = commands.func(path=payload, mode="slow")

    assert result == {
        "exit_code": 0, "timed_out": False,
        "output": f"[{payload!r}, '--count', '3', '{{literal}}'] slow\n",
    }  # fmt: skip
    assert not (tmp_path / "pwned").exists()


def test_a_value_outside_its_pattern_or_holding_nul_is_refused(commands: FunctionTool) -> None:
    refused = commands.func(path="a|b")["error"]
    assert refused.startswith("argument 'path' must match ")
    assert refused.endswith("; 'a|b' does not")
    assert commands.func(path="a\0b") == {
        "error": "argument 'path' holds a NUL character, which no command takes"
    }


def test_an_argument_the_declaration_lacks_is_refused(commands: FunctionTool) -> None:
    assert commands.func(path="a", extra="x") == {"error": "there is no argument 'extra'"}


def test_the_guard_holds_command_arguments_to_their_declared_types(commands: FunctionTool) -> None:
    guard = ToolGuard([commands.name], stage="label")

    assert guard.argument_problem("show", commands.func, {"path": "a", "count": 2}) is None
    assert guard.argument_problem("show", commands.func, {"path": "a", "count": "2"}) == (
        "count: input should be a valid integer, got a string"
    )
    assert "mode: input should be 'fast' or 'slow'" in str(
        guard.argument_problem("show", commands.func, {"path": "a", "mode": "rm"})
    )


def test_a_command_past_its_timeout_is_killed_and_says_so(tmp_path: Path) -> None:
    slow = CommandTool(kind="command", description="Sleeps.",
                       command=(sys.executable, "-c", "import time; time.sleep(30)"))  # fmt: skip
    tool = command_tool("slow", slow, LocalWorkspace(tmp_path), timeout_s=0.5)

    result = tool.func()

    assert (result["timed_out"], result["note"]) == (True, "killed after 0.5 s")
    assert result["exit_code"] < 0


# -- MCP servers and the toolbox --------------------------------------------------------------


def notes(folder: Path, tools: tuple[str, ...], **declared: Any) -> McpServer:
    server = write_notes_server(folder)
    return McpServer(kind="mcp", command=(sys.executable, str(server)), tools=tools,
                     timeout_s=20, **declared)  # fmt: skip


async def in_toolbox(names: list[str], declarations: dict[str, Any], act: Any, **bench: Any) -> Any:
    environ = {"NOTES_TOKEN": TOKEN}
    async with open_toolbox(names, declarations, ToolBench(stage="label", environ=environ,
                                                           **bench)) as toolbox:  # fmt: skip
        return await act(toolbox)


def test_an_mcp_server_offers_only_its_filtered_tools_and_its_secret_stays_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "the-worker-s-own-key")  # never the server's
    server = notes(tmp_path, ("get_note", "leak_env"), secrets={"NOTES_TOKEN": "NOTES_TOKEN"})

    async def act(toolbox: Any) -> Any:
        leak = next(tool for tool in toolbox.tools if tool.name == "leak_env")
        answer = await leak.run_async(args={"name": "NOTES_TOKEN"}, tool_context=None)
        home = await leak.run_async(args={"name": "GOOGLE_API_KEY"}, tool_context=None)
        return [t.name for t in toolbox.tools], toolbox.review(leak, answer), home

    names, leaked, unset = asyncio.run(in_toolbox(["notes"], {"notes": server}, act))

    assert names == ["get_note", "leak_env"]
    assert leaked["content"][0]["text"] == "[secret NOTES_TOKEN]"
    assert unset["structuredContent"] == {"result": ""}  # only what was declared reaches it


def test_an_mcp_server_that_does_not_start_is_a_stage_error_naming_it(tmp_path: Path) -> None:
    broken = McpServer(kind="mcp", command=(str(tmp_path / "no-such-server"),), tools=("x",),
                       timeout_s=5)  # fmt: skip

    with pytest.raises(StageError, match="the MCP server 'notes' of stage 'label' did not start "
                       "or answer: "):  # fmt: skip
        asyncio.run(in_toolbox(["notes"], {"notes": broken}, lambda _: asyncio.sleep(0)))


def test_an_mcp_server_without_a_filtered_tool_is_a_stage_error(tmp_path: Path) -> None:
    server = notes(tmp_path, ("get_note", "get_notes"))

    with pytest.raises(StageError, match="the MCP server 'notes' of stage 'label' has no tool "
                       r"get_notes that its filter names \(of the filter's tools it has: "
                       r"get_note\)"):  # fmt: skip
        asyncio.run(in_toolbox(["notes"], {"notes": server}, lambda _: asyncio.sleep(0)))


def test_an_mcp_server_that_dies_during_a_call_ends_the_stage_naming_it(tmp_path: Path) -> None:
    """Pins what ADK answers for a call whose server exits (`workers.tools.mcp`)."""
    server = notes(tmp_path, ("get_note", "crash"))

    async def act(toolbox: Any) -> Any:
        crash = next(tool for tool in toolbox.tools if tool.name == "crash")
        answer = await crash.run_async(args={"code": 3}, tool_context=None)
        return answer, toolbox.review, crash

    answer, review, crash = asyncio.run(in_toolbox(["notes"], {"notes": server}, act))

    assert answer == {"error": "MCP tool execution failed: Connection closed"}
    stopped = "the MCP server 'notes' of stage 'label' stopped during a call to crash: "
    with pytest.raises(StageError, match=stopped + "MCP tool execution failed: Connection closed"):
        review(crash, answer)


def test_a_stage_naming_an_undeclared_tool_or_a_command_without_sandbox_fails() -> None:
    with pytest.raises(StageError, match="stage 'label' names the tool 'lookup', which is neither "
                       "built in nor declared by its pipeline"):  # fmt: skip
        asyncio.run(in_toolbox(["lookup"], {}, lambda _: asyncio.sleep(0)))
    with pytest.raises(StageError, match="tool 'show' of stage 'label' runs in a sandbox; it has "
                       "none"):  # fmt: skip
        asyncio.run(in_toolbox(["show"], {"show": COMMAND}, lambda _: asyncio.sleep(0)))


def test_a_declared_tool_s_result_loses_its_secret_and_is_cut_to_the_stage_s_budget() -> None:
    """Through the agent's one after-tool path: the review (secrets out), then the budget."""
    fake = InProcessGemini({"agents": {"label": [
        {"call": {"name": "lookup_owner", "args": {"path": "p" * 5_000}}}, {"text": "done"},
    ]}})  # fmt: skip
    declaration = HostTool(kind="host", function=f"{SAMPLE}:lookup_owner",
                           settings={"region": "eu"}, secrets={"token": "TOKEN"})  # fmt: skip
    audit: list[dict[str, Any]] = []

    async def run() -> str:
        bench = ToolBench(stage="label", environ={"TOKEN": TOKEN})
        async with open_toolbox(["lookup_owner"], {"lookup_owner": declaration}, bench) as box:
            spec = AgentSpec(name="label", instruction="Label it.", contract="Reply.",
                             budget=StageBudget(max_tool_output_chars=600), tools=box.tools,
                             review_tool_result=box.review)  # fmt: skip
            usage = Usage()
            agent = build_agent(spec, fake.model(transient_attempts=1), usage)
            opened = StageSession.open(agent, session_id="r1:label:1", state={},
                                       audit=audit.extend, labels={}, usage=usage)  # fmt: skip
            async with opened as session:
                return await session.turn("Go.", max_model_calls=4)

    assert asyncio.run(run()) == "done"
    sent = fake.requests()[1]["request"]["contents"][-1]["parts"][0]["functionResponse"]
    response = sent["response"]
    assert response["auth"] == "Bearer [secret TOKEN]"
    assert response["truncated"].startswith("tool output cut to fit the budget: ")
    assert len(response["path"]) < 600
    assert TOKEN not in json.dumps(fake.requests()) + json.dumps(audit)
