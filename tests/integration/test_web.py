"""The web UI of `baton serve` for real: the server in a subprocess on the session's Redis, the
session worker running the demo's Sentry event, read by headless Chromium through the login
form — the runs list, a run's time line, its fix's diff and test log, its search stage's
transcript, the cancel and resume buttons, and a gate's approve button.

The first test keeps a screenshot of the run page in its temporary directory;
`BATON_RUN_PAGE_SCREENSHOT=docs/run-page.png` puts it where the README shows it."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import StageFigures, StageResult
from orchestrator.core.fanin import BranchRecord, BranchStatus, FanIn
from orchestrator.core.models import (
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.specs import pipeline_from_table
from orchestrator.core.store import RunStore
from testkit import services

from .conftest import Stack

STAGES = ("triage", "search", "plan", "reproduce", "fix", "pr")
SCREENSHOT_ENV = "BATON_RUN_PAGE_SCREENSHOT"
VIEWPORT = (1400, 1000)
FLOWER_URL = "http://flower.example:5555"
WAIT_S = 20.0
HOSTILE_TITLE = '<img src=x onerror="document.body.dataset.injected=1"><b>ZeroDivisionError</b>'
"""An issue's title is input from outside: the page must show it as text, never as HTML."""


@dataclass
class WebServer:
    url: str
    passwords: dict[str, str]
    """Login → password: `operator` has the control scope, `viewer` the read scope."""


@pytest.fixture(scope="module")
def web(session_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """`baton serve` on a free port with two fresh logins, once it answers its health check."""
    passwords = {"operator": secrets.token_urlsafe(16), "viewer": secrets.token_urlsafe(16)}
    env = {
        "BATON_SERVE_USER": "operator",
        "BATON_SERVE_PASSWORD": passwords["operator"],
        "BATON_SERVE_LOGINS": json.dumps({"viewer": f"read:{passwords['viewer']}"}),
        "BATON_SERVE_FLOWER_URL": FLOWER_URL,
    }
    logfile = tmp_path_factory.mktemp("serve") / "serve.log"
    redis_url = session_stack.settings.require_redis_url()
    with services.serve(redis_url, env, logfile=logfile) as url:
        yield WebServer(url, passwords)


# -- reading the pages ------------------------------------------------------------------------


def sized(driver: webdriver.Chrome) -> webdriver.Chrome:
    """The page's viewport exactly VIEWPORT (the window's own frame left aside)."""
    width, height = VIEWPORT
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def wait_for(driver: webdriver.Chrome, css: str, timeout_s: float = WAIT_S) -> WebElement:
    found: WebElement = WebDriverWait(driver, timeout_s).until(
        expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)),
        f"nothing shows {css!r}",
    )
    return found


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(what)


def text_of(element: WebElement) -> str:
    """The element's text as the page holds it (Selenium's `.text` trims and folds spaces)."""
    return str(element.get_attribute("textContent"))


def log_in(driver: webdriver.Chrome, web: WebServer, user: str, then: str) -> None:
    """Through the login form, from the redirect a page without a session answers with."""
    driver.get(f"{web.url}{then}")
    assert "/login?next=" in driver.current_url, driver.current_url
    submit_login(driver, user, web.passwords[user])
    wait_until(lambda: "/login" not in driver.current_url, f"{user} was not let in")


def submit_login(driver: webdriver.Chrome, user: str, password: str) -> None:
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "log-in").click()


def open_run_page(driver: webdriver.Chrome) -> None:
    wait_for(driver, 'main#run[data-loaded="true"]')


def shown_seconds(text: str) -> tuple[float, float]:
    """A duration as the page writes it (`724ms`, `5.1s`, `2m 05s`) and half its last digit."""
    if match := re.fullmatch(r"(\d+)ms", text):
        return int(match[1]) / 1000, 0.0005
    if match := re.fullmatch(r"(\d+\.\d)s", text):
        return float(match[1]), 0.05
    if match := re.fullmatch(r"(\d+)m (\d\d)s", text):
        return int(match[1]) * 60 + int(match[2]), 0.5
    raise AssertionError(f"not a duration: {text!r}")


def tool_calls(store: RunStore, run_id: str, stage: str) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls of a stage's session, in the order of the audit stream's raw entries."""
    calls = []
    for entry in store.audit_log(run_id):
        session_stage = entry.get("session", "::").split(":")[1]
        if entry["kind"] != "tool_call" or entry.get("stage", session_stage) != stage:
            continue
        for part in json.loads(entry["data"])["content"]["parts"]:
            if "function_call" in part:
                call = part["function_call"]
                calls.append((call["name"], call.get("args") or {}))
    return calls


def severe_console_lines(driver: webdriver.Chrome) -> list[str]:
    """Errors the page logged: a script failing, or a style or script the CSP refused."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_person_logs_in_and_follows_a_demo_run_from_the_list_to_its_transcript(
    web: WebServer,
    demo_run: RunRecord,
    run_store: RunStore,
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    run = demo_run
    driver = sized(browser)
    driver.get(f"{web.url}/runs/{run.id}")
    submit_login(driver, "operator", "not the password")
    refused = wait_for(driver, "#login-failed")
    assert refused.text == "Wrong user or password."
    assert driver.find_element(By.ID, "next").get_attribute("value") == f"/runs/{run.id}"
    log_in(driver, web, "operator", "/")

    # The runs list: the run by its whole id, linking to its page.
    row = wait_for(driver, f'#runs tbody tr[data-run-id="{run.id}"]')
    assert row.get_attribute("data-status") == "done"
    assert run.issue.title in row.text
    assert row.find_element(By.CSS_SELECTOR, "button.copy").get_attribute("data-copy") == run.id
    row.find_element(By.CSS_SELECTOR, "a.run-id").click()
    open_run_page(driver)
    assert driver.current_url.split("#")[0] == f"{web.url}/runs/{run.id}"
    assert driver.find_element(By.ID, "run-id").text == run.id
    assert driver.find_element(By.CSS_SELECTOR, "#run-status .status").text == "done"
    assert driver.find_element(By.ID, "issue-title").text == run.issue.title
    flower = driver.find_element(By.ID, "flower-tasks")
    assert flower.get_attribute("href") == f"{FLOWER_URL}/tasks"
    assert f"{run.id}.triage" in driver.find_element(By.ID, "flower").text
    assert driver.find_elements(By.ID, "cancel") == []  # it has ended

    # The time line: every stage, its running time written as the record has it, to scale.
    widths_per_s = []
    for stage in STAGES:
        line = driver.find_element(By.CSS_SELECTOR, f'#timeline .tl-row[data-stage="{stage}"]')
        record = run.stages[stage]
        assert record.started_at is not None and record.finished_at is not None
        took_s = record.finished_at - record.started_at
        seconds, rounding = shown_seconds(line.find_element(By.CSS_SELECTOR, ".tl-duration").text)
        assert seconds > 0, stage
        assert abs(seconds - took_s) <= rounding + 1e-6, (stage, seconds, took_s)
        bars = line.find_elements(By.CSS_SELECTOR, '.tl-bar[data-state="done"]')
        assert len(bars) == 1, stage
        if took_s > 0.5:  # shorter bars have a minimum width
            widths_per_s.append(bars[0].rect["width"] / took_s)
    assert len(widths_per_s) >= 3
    assert max(widths_per_s) / min(widths_per_s) < 1.05, widths_per_s

    # The fix stage: its proof, its diff coloured, its test log as stored.
    driver.find_element(By.CSS_SELECTOR, '#stage-tabs [data-tab="fix"]').click()
    wait_for(driver, '#stage-panel[data-stage="fix"] [data-proof="passed"]')
    proof = run_store.output(run.id, "fix")
    assert proof is not None
    listed = driver.find_elements(By.CSS_SELECTOR, '[data-list="fail_to_pass"] li')
    assert [text_of(li) for li in listed] == proof["proof"]["fail_to_pass"]

    diff = run_store.artifact(run.stages["fix"].artifacts["workspace.diff"]).decode()
    files = re.findall(r"^\+\+\+ b/(\S+)$", diff, re.MULTILINE)
    added = next(line for line in diff.splitlines() if re.match(r"\+(?!\+\+ )", line))
    viewer = open_artifact(driver, "fix/workspace.diff")
    assert files and all(name in text_of(viewer) for name in files)
    coloured = [text_of(line) for line in viewer.find_elements(By.CSS_SELECTOR, ".diff-add")]
    assert added in coloured

    log = run_store.artifact(run.stages["fix"].artifacts["tests-after.log"]).decode()
    viewer = open_artifact(driver, "fix/tests-after.log")
    assert text_of(viewer.find_element(By.CSS_SELECTOR, "pre.log")) == log
    assert any(line.strip() for line in log.splitlines())

    # The search stage's transcript: its tool calls in the audit stream's order, with their
    # arguments; a long tool result cut, and shown whole on request.
    driver.find_element(By.CSS_SELECTOR, '#stage-tabs [data-tab="search"]').click()
    wait_for(driver, '[data-transcript="search"][data-complete="true"]')
    expected = tool_calls(run_store, run.id, "search")
    shown = driver.find_elements(By.CSS_SELECTOR, '[data-transcript="search"] .part.call')
    assert [element.get_attribute("data-tool") for element in shown] == [n for n, _ in expected]
    assert len(expected) >= 2
    for element, (_, args) in zip(shown, expected, strict=True):
        for value in args.values():
            assert str(value) in text_of(element)
    read = driver.find_element(
        By.CSS_SELECTOR, '[data-transcript="search"] .part.result[data-tool="read_file"]'
    )
    last_line = "return self.total_cents() // self.item_count()"
    assert last_line not in text_of(read)
    read.find_element(By.CSS_SELECTOR, "button.expand").click()
    assert last_line in text_of(read)

    driver.execute_script("window.scrollTo(0, 0)")
    screenshot = tmp_path / "run-page.png"
    assert driver.save_screenshot(str(screenshot)), f"no screenshot written to {screenshot}"
    if os.environ.get(SCREENSHOT_ENV):
        published = Path(os.environ[SCREENSHOT_ENV])
        published.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(published)), f"no screenshot written to {published}"
    assert severe_console_lines(driver) == []


def open_artifact(driver: webdriver.Chrome, name: str) -> WebElement:
    """Clicks the artifact's View button and returns the viewer once it shows it."""
    row = driver.find_element(By.CSS_SELECTOR, f'#stage-panel tr[data-artifact="{name}"]')
    row.find_element(By.CSS_SELECTOR, "button.view").click()
    return wait_for(driver, f'[data-viewer][data-artifact="{name}"][data-ready="true"]')


@pytest.mark.timeout(240)
def test_a_viewer_has_no_cancel_button_and_an_operator_cancels_and_resumes_the_run(
    web: WebServer, stack: Stack, browser: webdriver.Chrome
) -> None:
    # The triage stage's model call takes 10 s: time to look at the run and cancel it.
    stack.fake.set_faults([{"agent": "triage", "latency_ms": 10_000}])
    event = {**json.loads(SENTRY_EVENT.read_text()), "title": HOSTILE_TITLE}
    run_id = stack.enqueue(json.dumps(event), stack.sample_repo())
    wait_until(lambda: triage_status(stack, run_id) == StageStatus.RUNNING,
               "the triage stage never started")  # fmt: skip
    driver = sized(browser)
    page = f"/runs/{quote(run_id)}"

    log_in(driver, web, "viewer", page)
    open_run_page(driver)
    assert driver.find_element(By.CSS_SELECTOR, "#run-status .status").text == "running"
    assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-scope") == "read"
    assert text_of(driver.find_element(By.ID, "issue-title")) == HOSTILE_TITLE
    assert driver.find_elements(By.CSS_SELECTOR, "#run-header img, #run-header b") == []
    assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-injected") is None
    assert driver.find_elements(By.ID, "cancel") == []
    assert driver.find_elements(By.ID, "resume") == []
    driver.find_element(By.ID, "logout").click()
    wait_until(lambda: driver.current_url == f"{web.url}/login", "the logout did not end")

    log_in(driver, web, "operator", page)
    open_run_page(driver)
    wait_for(driver, "#cancel").click()
    confirm = WebDriverWait(driver, 5).until(expected_conditions.alert_is_present())
    assert run_id in confirm.text
    confirm.accept()

    said = wait_for(driver, "#control-message")
    wait_until(lambda: "cancelled" in said.text, f"the page said {said.text!r}")
    assert api.get_run(run_id, settings=stack.settings).status is RunStatus.CANCELLED
    wait_for(driver, '#run-status .status[data-status="cancelled"]')
    assert driver.find_elements(By.ID, "cancel") == []
    assert driver.find_element(By.ID, "resume").is_displayed()  # what a cancelled run offers
    # The worker is shared: let the stopped stage finish its model call and stop.
    wait_until(lambda: triage_status(stack, run_id) == StageStatus.CANCELLED,
               "the triage stage did not stop", 30)  # fmt: skip

    # Resumed with its button, the run goes on from where it stopped; the page follows it.
    stack.fake.set_faults([])
    driver.find_element(By.ID, "resume").click()
    WebDriverWait(driver, 5).until(expected_conditions.alert_is_present()).accept()
    wait_until(lambda: said.text == "Resumed from triage.", f"the page said {said.text!r}")
    wait_for(driver, '#run-status .status[data-status="done"]', 120)
    assert api.get_run(run_id, settings=stack.settings).status is RunStatus.DONE


def triage_status(stack: Stack, run_id: str) -> StageStatus:
    return api.get_run(run_id, settings=stack.settings).stages["triage"].status


@pytest.mark.timeout(120)
def test_an_operator_approves_a_parked_run_from_its_page(
    web: WebServer, session_stack: Stack, browser: webdriver.Chrome
) -> None:
    # Parked by the conductor itself (no model call needed): a gated plan, done, awaiting.
    with api.connect(session_stack.settings) as conductor:
        run_id = park_a_run(conductor)
    driver = sized(browser)
    log_in(driver, web, "operator", f"/runs/{quote(run_id)}")
    open_run_page(driver)
    wait_for(driver, '#run-status .status[data-status="awaiting_approval"]')
    assert "Gate plan awaits approval of plan's plan" in wait_for(driver, "#run-gates").text
    assert driver.find_element(By.ID, "reject-plan").is_displayed()

    wait_for(driver, "#approve-plan").click()
    confirm = WebDriverWait(driver, 5).until(expected_conditions.alert_is_present())
    assert run_id in confirm.text
    confirm.accept()

    said = wait_for(driver, "#control-message")
    wait_until(lambda: said.text == "Gate plan approved: act queued.",
               f"the page said {said.text!r}")  # fmt: skip
    run = api.get_run(run_id, settings=session_stack.settings)
    assert (run.status, run.gates["plan"].decided_by) == (RunStatus.QUEUED, "operator")
    assert run.stages["act"].status == StageStatus.QUEUED
    wait_until(lambda: driver.find_elements(By.ID, "approve-plan") == [], "the button stayed")
    assert severe_console_lines(driver) == []
    api.cancel(run_id, settings=session_stack.settings)  # no worker serves its next stage


@pytest.mark.timeout(120)
def test_an_operator_approves_a_plan_with_an_edit_and_sees_branches_side_by_side(
    web: WebServer, session_stack: Stack, browser: webdriver.Chrome
) -> None:
    # A hand-built fan-in on the parked stage: the time line draws a lane per branch.
    with api.connect(session_stack.settings) as conductor:
        run_id = park_a_run(conductor)
        conductor.store.transact(run_id, lambda run, _: branched(run.stages["plan"]))
        conductor.store.audit(run_id, [
            {"ts": repr(time.time()), "branch": f"gated-web.plan.{branch}", "kind": "model_reply",
             "session": f"{run_id}:plan:{branch}:1", "author": "plan",
             "data": {"content": {"parts": [{"text": f"the plan of {branch}"}]}}}
            for branch in ("b1", "b2")
        ])  # fmt: skip
        store = conductor.store
        driver = sized(browser)
        log_in(driver, web, "operator", f"/runs/{quote(run_id)}")
        open_run_page(driver)
        lanes = driver.find_elements(By.CSS_SELECTOR, '.tl-branch[data-stage="plan"]')
        assert [lane.get_attribute("data-branch") for lane in lanes] == ["b1", "b2"]
        assert [lane.get_attribute("data-selected") for lane in lanes] == ["false", "true"]
        assert lanes[1].find_element(By.CLASS_NAME, "tl-name").text == "└ b2 ★"
        link = wait_for(driver, 'tr[data-branch="b2"] a.flower-task')  # the plan stage's panel
        tagged = wait_for(driver, '.transcript li[data-branch="b2"]')  # its transcript's entry
        assert tagged.find_element(By.CLASS_NAME, "lane").text == "b2"
        assert "the plan of b2" in text_of(tagged)
        assert link.get_attribute("href") == f"{FLOWER_URL}/task/{quote(run_id)}.plan.b2"

        wait_for(driver, "#edit-plan").click()
        editor = wait_for(driver, "#gate-edit")
        wait_until(lambda: '"guard total()"' in str(editor.get_attribute("value")),
                   "the editor was not prefilled with the plan")  # fmt: skip
        for bad, said in (("{ not json", "The edit is not JSON"),
                          ('{"summary": 7}', "Gate plan was not approved: ")):  # fmt: skip
            editor.clear()
            editor.send_keys(bad)
            driver.find_element(By.ID, "gate-edit-approve").click()
            error = wait_for(driver, "#gate-edit-error")
            shown = lambda said=said, error=error: said in error.text  # noqa: E731
            wait_until(shown, f"the editor never said {said!r}")
        assert "summary" in error.text  # the server's 422 names the field
        assert store.get(run_id).status is RunStatus.AWAITING_APPROVAL

        editor.clear()
        editor.send_keys('{"summary": "guard total() and test an empty cart"}')
        driver.find_element(By.ID, "gate-edit-approve").click()
        message = wait_for(driver, "#control-message")
        wait_until(lambda: message.text == "Gate plan approved: act queued.",
                   f"the page said {message.text!r}")  # fmt: skip
        assert store.output(run_id, "plan") == {"summary": "guard total() and test an empty cart"}
        assert not driver.find_element(By.ID, "gate-editor").is_displayed()
    refused = [line for line in severe_console_lines(driver) if "status of 422" not in line]
    assert refused == []
    api.cancel(run_id, settings=session_stack.settings)  # no worker serves its next stage


def branched(record: StageRecord) -> None:
    """Two branches on `record`, both done, b2 selected."""
    record.fan_in = FanIn(
        branches={
            name: BranchRecord(status=BranchStatus.DONE, attempts=1, started_at=start,
                               finished_at=start + 1.0, session_id=f"r:plan:{name}:1")
            for name, start in (("b1", record.started_at or 0.0),
                                ("b2", (record.started_at or 0.0) + 0.2))
        },
        ended=2, joined=True, selected="b2",
    )  # fmt: skip


def park_a_run(conductor: Conductor) -> str:
    """A run of a two-stage pipeline whose first stage's gate waits for approval."""
    summary = "orchestrator.pipelines.schemas:Summary"
    gated = pipeline_from_table({"name": "gated-web", "stages": [
        {"name": "plan", "instruction": "{issue}", "output_schema": summary,
         "gate": {"approve": "plan"}},
        {"name": "act", "instruction": "{plan}", "output_schema": summary},
    ]}, origin="gated-web")  # fmt: skip
    issue = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart")
    run_id, _ = conductor.submit(issue, repo="/r", commit="c" * 40, pipeline=gated, force=True)
    conductor.begin(run_id, "plan", owner="web:1:t", lease_s=30, max_interrupted=3)
    plan = StageResult({"summary": "guard total()"}, StageFigures())
    conductor.complete(run_id, "plan", plan, owner="web:1:t")
    return run_id
