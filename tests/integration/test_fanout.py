"""Best-of-3 for real: a `parallel = 3` fix stage over three Celery worker processes, Redis, Docker
sandboxes and the fake Gemini server. Three fresh sessions run at once and none sees another's
conversation (from the fake server's request log, with a negative control); the branch whose
proof passes with the smallest diff becomes the stage's output and is the one published, once.
And a worker SIGKILLed while it runs two of the three branches: each branch ends once, the
fan-in happens once, the next stage runs once."""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.models import ArtifactRef, RunRecord, RunStatus
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.leaks import call_key, find_leaks
from testkit.services import worker_env
from tests.containers import sandboxes
from tests.repos import Git

from .conftest import demo_scenario, stack_settings

SCHEMAS = "orchestrator.pipelines.fixer.schemas"
BEST_OF_3 = f"""
name = "best3"

[[stages]]
name = "reproduce"
output_schema = "{SCHEMAS}:Reproduction"
tools = ["search_code", "edit_file", "run_tests"]
reproduce = {{ command_from = "test_command", test_files_from = "test_files", expected_failure_from = "expected_failure" }}
instruction = "Write a test that reproduces this report: {{issue}}"

[[stages]]
name = "fix"
output_schema = "{SCHEMAS}:Fix"
tools = ["edit_file", "show_diff"]
parallel = 3
select = "proof"
proof = {{ reproduction_from = "reproduce" }}
instruction = '''
You are candidate {{branch}} of three. Fix the defect that this test reproduces:
{{reproduce}}
'''

[[stages]]
name = "pr"
output_schema = "{SCHEMAS}:PullRequest"
tools = ["show_diff", "publish"]
instruction = "Publish the fix in your workspace: {{fix}}"
"""  # noqa: E501
QUEUES = ["baton.best3.reproduce", "baton.best3.fix", "baton.best3.pr"]
BRANCHES = ("b1", "b2", "b3")
SUITE = "python3 -m unittest discover -s tests -t ."
OLD = "        return self.total_cents() // self.item_count()\n"
GUARD = "        count = self.item_count()\n        if count == 0:\n            return 0\n"
NEW_TEXT = {
    "b1": "        return -1\n",  # wrong: the reproducing test still fails
    "b2": GUARD + "        return self.total_cents() // count\n",  # right, and the smallest
    "b3": "        # An empty cart has no units to share its total among, so its average\n"
    "        # is 0 rather than a division by zero (the report's crash).\n"
    + GUARD
    + "        return self.total_cents() // count\n",  # right, with a larger diff
}
FAST_RECOVERY = {
    "BATON_QUEUE__LEASE_S": "6",
    "BATON_QUEUE__RECONCILE_EVERY_S": "1",
    "BATON_QUEUE__STUCK_AFTER_S": "5",
}
"""A branch lost with its worker is back within seconds (defaults: lease 30 s, reconcile every
30 s), as in `test_recovery`."""


def fix_steps(branch: str) -> list[dict[str, Any]]:
    """What candidate `branch` does: its own edit, a look at its diff, its report."""
    return [
        {"call": {"name": "edit_file", "args": {"path": "shopcart/cart.py", "old_text": OLD,
                                                "new_text": NEW_TEXT[branch]}}},
        {"call": {"name": "show_diff", "args": {}}},
        {"json": {"summary": f"candidate {branch} guarded the average of an empty cart",
                  "files_changed": ["shopcart/cart.py"], "test_command": SUITE,
                  "tests_passed": True}},
    ]  # fmt: skip


def scenario() -> dict[str, Any]:
    """The demo's reproduction and publication; three candidate fixes, one per branch, told
    apart by the `{branch}` each branch's instruction holds."""
    demo = demo_scenario()["agents"]
    fix = {
        "steps": fix_steps("b1"),
        "variants": [{"when": f"candidate {b} of three", "steps": fix_steps(b)} for b in BRANCHES],
    }
    return {"agents": {"reproduce": demo["reproduce"], "fix": fix, "pr": demo["pr"]}}


@dataclass
class Bench:
    settings: Settings
    store: RunStore
    fake: FakeGemini
    spec: Path
    work: Path

    def sample_repo(self) -> Path:
        """A copy of the demo's repository under a name no other test of the module has."""
        return make_sample_repo(self.work / f"shop-{time.monotonic_ns()}.git")

    def enqueue(
        self, repo: Path, spec: Path | None = None,
        text: str = "Checkout crashes with ZeroDivisionError on an empty cart", **given: Any,
    ) -> str:  # fmt: skip
        """A run of `spec` (the module's best-of-3 by default) on `repo`."""
        return api.enqueue(text, repo=str(repo), pipeline=str(spec or self.spec),
                           settings=self.settings, force=True, **given)  # fmt: skip

    def env(self, **more: str) -> dict[str, str]:
        return {**worker_env(self.settings), **more}

    def wait(self, run_id: str, timeout_s: float = 90.0) -> RunRecord:
        deadline = time.monotonic() + timeout_s
        while not (run := self.store.get(run_id)).status.is_terminal:
            assert time.monotonic() < deadline, f"run {run_id} is still {run.status}"
            time.sleep(0.1)
        return run

    def fix_requests(self) -> dict[str, list[dict[str, Any]]]:
        """The fix stage's logged requests, by the branch whose instruction they carry."""
        mine: dict[str, list[dict[str, Any]]] = {branch: [] for branch in BRANCHES}
        for entry in self.fake.requests():
            if entry["agent"] == "fix":
                said = json.dumps(entry["request"].get("systemInstruction"))
                (branch,) = [b for b in BRANCHES if f"candidate {b} of three" in said]
                mine[branch].append(entry)
        return mine

    def kinds(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.store.audit_log(run_id) if e["kind"] == kind]

    def ran(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        """The `kind` begin entries (`stage_begin`, `branch_begin`) that started an execution."""
        return [e for e in self.kinds(run_id, kind) if json.loads(e["data"])["action"] == "run"]

    def conversations(self, agent: str) -> int:
        """How many sessions of `agent` the fake server saw: requests with no model turn yet."""
        return sum(
            1
            for e in self.fake.requests()
            if e["agent"] == agent
            and not any(c.get("role") == "model" for c in e["request"]["contents"])
        )


@pytest.fixture(scope="module")
def bench(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    work = tmp_path_factory.mktemp("fanout")
    client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/9", decode_responses=True)
    client.flushdb()
    spec = work / "best3.toml"
    spec.write_text(BEST_OF_3)
    with FakeGemini.start(scenario()) as fake:
        settings = stack_settings(redis_url.rsplit("/", 1)[0] + "/9", fake, work)
        yield Bench(settings, RunStore(client), fake, spec, work)
    client.flushdb()
    client.close()


def started_together(stack: ExitStack, bench: Bench, names: list[str]) -> None:
    """Start worker daemons at once (each waits for its own `ready.`) and stop them at once
    when `stack` closes: one after the other, each costs its start-up and its warm shutdown."""
    workers = [services.worker(bench.env(), QUEUES, logfile=bench.work / f"{name}.log",
                               name=name) for name in names]  # fmt: skip
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda worker: worker.__enter__(), workers))

    def stop_all() -> None:
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(lambda worker: worker.__exit__(None, None, None), workers))

    stack.callback(stop_all)


def running_branches(bench: Bench, run_id: str) -> list[str]:
    fan = bench.store.get(run_id).stages["fix"].fan_in
    running = fan.branches.items() if fan is not None else []
    return [name for name, branch in running if branch.status == BranchStatus.RUNNING]


def overlap(entries: list[dict[str, Any]]) -> tuple[float, float]:
    """When a branch's model calls began and ended (the fake server's clock)."""
    return min(e["ts"] for e in entries), max(e["replied"] for e in entries)


@pytest.mark.timeout(120)
def test_best_of_3_runs_three_isolated_sessions_at_once_and_publishes_the_proven_smallest(
    bench: Bench, git: Git
) -> None:
    bench.fake.set_scenario(scenario())
    bench.fake.reset()
    bench.fake.set_faults([{"agent": "fix", "latency_ms": 400}])
    repo = bench.sample_repo()
    with ExitStack() as stack:
        started_together(stack, bench, ["w1", "w2", "w3"])
        run = bench.wait(bench.enqueue(repo))

    assert run.status == RunStatus.DONE, run.reason
    fan = run.stages["fix"].fan_in
    assert fan is not None and (fan.ended, fan.joined, fan.selected) == (3, True, "b2")
    # b1's diff is the smallest, but its proof failed, which ends a branch failed with why.
    statuses = [fan.branches[b].status for b in BRANCHES]
    assert statuses == [BranchStatus.FAILED, BranchStatus.DONE, BranchStatus.DONE]
    assert (fan.branches["b1"].error or "").startswith(
        "the change is not proven: the reproducing tests still fail"
    )
    assert [fan.branches[b].proof_passed for b in BRANCHES] == [None, True, True]
    sizes = [fan.branches[b].diff_bytes or 0 for b in BRANCHES]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    # Three worker processes, one branch each, each in its own session.
    begun = bench.ran(run.id, "branch_begin")
    owners = {json.loads(e["data"])["owner"].split(":")[1] for e in begun}
    assert len(begun) == 3 and len(owners) == 3
    assert {e["session"] for e in begun} == {f"{run.id}:fix:{b}:1" for b in BRANCHES}
    assert {fan.branches[b].session_id for b in BRANCHES} == {e["session"] for e in begun}
    # Their model calls overlapped in time.
    requests = bench.fix_requests()
    spans = [overlap(requests[b]) for b in BRANCHES]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    # The chosen branch's output and diff are the stage's; it is what was published, once.
    assert bench.store.output(run.id, "fix")["summary"].startswith("candidate b2 ")
    assert run.stages["fix"].artifacts["workspace.diff"].name == "fix/b2/workspace.diff"
    diffs = [
        ArtifactRef.model_validate(fan.branches[b].artifacts["workspace.diff"]) for b in BRANCHES
    ]
    assert [ref.name for ref in diffs] == [f"fix/{b}/workspace.diff" for b in BRANCHES]
    assert len({bench.store.artifact(ref) for ref in diffs}) == 3  # none overwrote another
    published = git("diff", f"main..baton/{run.id}", "--", "shopcart/cart.py", cwd=repo)
    assert "+        if count == 0:" in published
    assert "return -1" not in published and "share its total" not in published  # b1's, b3's
    assert git("branch", "--list", "baton/*", cwd=repo).split() == [f"baton/{run.id}"]
    assert len([e for e in bench.ran(run.id, "stage_begin") if e["branch"] == "best3.pr"]) == 1
    assert bench.conversations("pr") == 1

    # None saw another's conversation: each branch's requests hold only its own calls and
    # tool results.
    by_branch = {b: [e["request"] for e in requests[b]] for b in BRANCHES}
    own = {b: {call_key(s["call"]) for s in fix_steps(b) if "call" in s} for b in BRANCHES}
    shared = json.dumps(bench.store.output(run.id, "reproduce")) + run.issue.digest()
    allowed = {b: shared for b in BRANCHES}
    assert find_leaks(by_branch, own_calls=own, allowed=allowed) == []
    # The negative control: b1's turns replayed into b2's last request, as a session shared
    # between branches would, are found by the same check.
    planted = copy.deepcopy(by_branch)
    b1_turns = by_branch["b1"][-1]["contents"][1:]
    planted["b2"][-1]["contents"][1:1] = b1_turns
    found = find_leaks(planted, own_calls=own, allowed=allowed)
    assert {(leak.owner, leak.seen_by, leak.kind) for leak in found} == {
        ("b1", "b2", "function call part")
    }


@pytest.mark.timeout(150)
def test_a_worker_killed_while_it_runs_two_branches_joins_once_and_publishes_once(
    bench: Bench, git: Git
) -> None:
    """The victim (two pool processes) takes two branches, whose model calls the fake server
    holds 15 s; the third waits on the queue. SIGKILLed with both in their sandboxes, it is
    replaced by a survivor, whose model calls are not held: it runs the third at once and, once
    the reconciler sees the two leases lapse, the other two again (`<run>.fix.b1`: the same
    task ids)."""
    bench.fake.set_scenario(scenario())
    bench.fake.reset()
    bench.fake.set_faults([{"agent": "fix", "latency_ms": 15_000}])
    repo = bench.sample_repo()
    env = bench.env(**FAST_RECOVERY)
    with ExitStack() as stack:
        victim = stack.enter_context(
            services.worker(env, QUEUES, logfile=bench.work / "victim.log", concurrency=2)
        )
        run_id = bench.enqueue(repo)
        deadline = time.monotonic() + 60
        while len(sandboxes(run_id, "fix")) < 2 or len(running_branches(bench, run_id)) < 2:
            assert time.monotonic() < deadline, "two branches never got going"
            time.sleep(0.1)
        time.sleep(1.0)  # into their held model calls
        killed = running_branches(bench, run_id)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        bench.fake.set_faults([])
        stack.enter_context(
            services.worker(env, QUEUES, logfile=bench.work / "survivor.log", concurrency=3)
        )
        run = bench.wait(run_id, timeout_s=100)

    assert run.status == RunStatus.DONE, run.reason
    fan = run.stages["fix"].fan_in
    assert fan is not None and (fan.ended, fan.selected) == (3, "b2")
    assert len(killed) == 2
    for branch in BRANCHES:
        record = fan.branches[branch]
        expected = (2, 1) if branch in killed else (1, 0)
        assert (record.attempts, record.interrupted) == expected, branch
    ended = [e["branch"] for kind in ("branch_done", "branch_failed")
             for e in bench.kinds(run_id, kind)]  # fmt: skip
    assert sorted(ended) == [f"best3.fix.{b}" for b in BRANCHES]  # each once
    assert len(bench.kinds(run_id, "fan_in_joined")) == 1
    assert len([e for e in bench.ran(run_id, "stage_begin") if e["branch"] == "best3.pr"]) == 1
    assert bench.conversations("pr") == 1
    assert git("branch", "--list", "baton/*", cwd=repo).split() == [f"baton/{run_id}"]


SPREAD = f"""
name = "spread"

[[stages]]
name = "search"
output_schema = "{SCHEMAS}:Search"
instruction = "Find where this report's fault lives: {{issue}}"

[[stages]]
name = "inspect"
output_schema = "orchestrator.pipelines.schemas:Summary"
map = "search.locations"
instruction = "Say whether this location is at fault: {{item}}"

[[stages]]
name = "report"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Sum up these inspections: {{inspect}}"
"""
SPREAD_QUEUES = ["baton.spread.search", "baton.spread.inspect", "baton.spread.report"]
PATHS = ("shopcart/cart.py", "shopcart/checkout.py")


def spread_scenario() -> dict[str, Any]:
    """Search finds two locations; each inspection says which one it looked at."""
    found = [{"path": path, "line_start": 20, "line_end": 28, "why": f"{path} divides"}
             for path in PATHS]  # fmt: skip
    inspect = {
        "steps": [{"json": {"summary": "no location"}}],
        "variants": [{"when": f'"path": "{path}"',
                      "steps": [{"json": {"summary": f"{path}: looked"}}]} for path in PATHS],
    }  # fmt: skip
    return {"agents": {
        "search": [{"json": {"root_cause": "division by zero", "locations": found}}],
        "inspect": inspect,
        "report": [{"json": {"summary": "both looked at"}}],
    }}  # fmt: skip


@pytest.mark.timeout(90)
def test_a_map_stage_runs_one_isolated_branch_per_item_and_gathers_them_in_order(
    bench: Bench,
) -> None:
    """With a 429 on the first inspection: that branch alone goes back on its queue for the
    server's delay and runs again; the other is untouched."""
    bench.fake.set_scenario(spread_scenario())
    bench.fake.reset()
    bench.fake.set_faults([{"agent": "inspect", "requests": [1], "status": 429,
                            "retry_delay_s": 1}])  # fmt: skip
    spec = bench.work / "spread.toml"
    spec.write_text(SPREAD)
    with services.worker(bench.env(), SPREAD_QUEUES, logfile=bench.work / "spread.log",
                         concurrency=2):  # fmt: skip
        repo = bench.sample_repo()
        run_id = bench.enqueue(repo, spec, "Checkout crashes on an empty cart")
        run = bench.wait(run_id, timeout_s=60)

    assert run.status == RunStatus.DONE, run.reason
    fan = run.stages["inspect"].fan_in
    assert fan is not None and [(b.item, b.status) for b in fan.branches.values()] == [
        (0, BranchStatus.DONE), (1, BranchStatus.DONE)
    ]  # fmt: skip
    retried = sorted((b.rate_limit_retries, b.attempts) for b in fan.branches.values())
    assert retried == [(0, 1), (1, 2)]
    assert bench.store.output(run_id, "inspect") == {
        "items": [{"summary": f"{path}: looked"} for path in PATHS]
    }
    inspections = [json.dumps(e["request"]) for e in bench.fake.requests()
                   if e["agent"] == "inspect" and e["status"] == 200]  # fmt: skip
    assert len(inspections) == 2  # one session per item, each holding its item and no other
    assert sorted(sum(path in request for path in PATHS) for request in inspections) == [1, 1]
    (report,) = [json.dumps(e["request"]) for e in bench.fake.requests() if e["agent"] == "report"]
    assert all(f"{path}: looked" in report for path in PATHS)


@pytest.mark.timeout(120)
def test_a_run_budget_crossed_mid_fan_out_stops_every_branch_and_publishes_nothing(
    bench: Bench, git: Git
) -> None:
    """Three branches at once, each holding its sandbox, make their first model calls; the
    budget leaves room for one more call of the run: the one after is refused. The refused
    branch's execution ends the run with the reason; its siblings are fenced off at their next
    step, every sandbox of the stage goes, nothing joins and nothing is published."""
    bench.fake.set_scenario(scenario())
    bench.fake.reset()
    bench.fake.set_faults([{"agent": "fix", "latency_ms": 1500}])
    reproduce_calls = len(demo_scenario()["agents"]["reproduce"]["steps"])
    repo = bench.sample_repo()
    with services.worker(bench.env(), QUEUES, logfile=bench.work / "budget.log", concurrency=3):
        run_id = bench.enqueue(repo, budget=RunBudget(calls=reproduce_calls + 4))
        run = bench.wait(run_id, timeout_s=90)
        deadline = time.monotonic() + 30  # the siblings' executions stop at their next step
        while sandboxes(run_id, "fix") and time.monotonic() < deadline:
            time.sleep(0.2)

    assert run.status == RunStatus.FAILED
    assert run.reason is not None and run.reason == (
        f"fix: run budget exceeded: model calls: {reproduce_calls + 4} made, "
        f"limit {reproduce_calls + 4}"
    )
    fan = run.stages["fix"].fan_in
    assert fan is not None and not fan.joined and fan.selected is None
    assert all(b.status != BranchStatus.DONE for b in fan.branches.values())
    assert len(bench.ran(run_id, "branch_begin")) == 3, "all three ran when the limit fell"
    assert sandboxes(run_id, "fix") == [], "every branch's sandbox is removed"
    assert bench.kinds(run_id, "fan_in_joined") == []
    assert [e for e in bench.ran(run_id, "stage_begin") if e["branch"] == "best3.pr"] == []
    assert git("branch", "--list", "baton/*", cwd=repo).split() == []
    calls = [e for e in bench.fake.requests() if e["status"] == 200]
    assert len(calls) <= reproduce_calls + 4, "no call past the limit reached the model"


JUDGED = """
name = "judged"

[[stages]]
name = "draft"
output_schema = "orchestrator.pipelines.schemas:Summary"
parallel = 2
select = { judge = "pick", field = "summary" }
instruction = "You are candidate {branch} of two. Propose a one-line fix for: {issue}"

[[stages]]
name = "pick"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Answer with only the id of the candidate to keep: {draft}"

[[stages]]
name = "act"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Carry out this fix: {draft}"
"""
JUDGED_QUEUES = ["baton.judged.draft", "baton.judged.pick", "baton.judged.act"]
IDEAS = {"b1": "IDEA-ONE: rewrite checkout", "b2": "IDEA-TWO: guard the empty cart"}


@pytest.mark.timeout(90)
def test_a_judge_sees_only_the_candidates_outputs_and_its_choice_is_what_comes_next(
    bench: Bench,
) -> None:
    drafts = [{"when": f"candidate {b} of two", "steps": [{"json": {"summary": IDEAS[b]}}]}
              for b in IDEAS]  # fmt: skip
    bench.fake.set_scenario({"agents": {
        "draft": {"steps": [{"json": {"summary": "none"}}], "variants": drafts},
        "pick": [{"json": {"summary": "b2"}}],
        "act": [{"json": {"summary": "done"}}],
    }})  # fmt: skip
    bench.fake.reset()
    bench.fake.set_faults([])
    spec = bench.work / "judged.toml"
    spec.write_text(JUDGED)
    with services.worker(bench.env(), JUDGED_QUEUES, logfile=bench.work / "judged.log",
                         concurrency=2):  # fmt: skip
        repo = bench.sample_repo()
        run_id = bench.enqueue(repo, spec, "Checkout crashes on an empty cart")
        run = bench.wait(run_id, timeout_s=60)

    assert run.status == RunStatus.DONE, run.reason
    assert run.stages["draft"].fan_in is not None and run.stages["draft"].fan_in.selected == "b2"
    assert bench.store.output(run_id, "draft") == {"summary": IDEAS["b2"]}

    def said(agent: str) -> list[str]:
        """The system instruction of each of `agent`'s requests, as text."""
        return ["".join(part.get("text", "") for part in e["request"]["systemInstruction"]["parts"])
                for e in bench.fake.requests() if e["agent"] == agent]  # fmt: skip

    (pick,) = said("pick")  # the candidates' outputs by id, and nothing of their sessions
    candidates, _ = json.JSONDecoder().raw_decode(pick, pick.index("{"))  # the first value
    assert candidates == {b: {"summary": IDEAS[b]} for b in IDEAS}
    assert "candidate b1 of two" not in json.dumps([e["request"] for e in bench.fake.requests()
                                                   if e["agent"] == "pick"])  # fmt: skip
    (act,) = said("act")
    assert IDEAS["b2"] in act and IDEAS["b1"] not in act
