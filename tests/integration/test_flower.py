"""`baton flower` for real: Flower in a subprocess watching the session worker run the demo's
Sentry event, read by headless Chromium (Debian's chromium and chromedriver, no downloads).

The browser test keeps a screenshot of the Tasks page in its temporary directory;
`BATON_FLOWER_SCREENSHOT=docs/flower.png` puts it where the README shows it."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium import webdriver

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.core.models import RunStatus
from testkit import services

from .conftest import Stack, wrong_fix_first

STAGES = ("triage", "search", "plan", "reproduce", "fix", "review", "pr")
SCREENSHOT_ENV = "BATON_FLOWER_SCREENSHOT"

# The cells of the Tasks page as a person reads them, by column slug. DataTables may render the
# header twice (a clone for scrolling), hence the dedup; a worker's name is two flex items,
# which innerText separates with a newline.
READ_TASKS_TABLE = r"""
const columns = [...new Set([...document.querySelectorAll('th[data-column]')]
    .map(th => th.dataset.column))];
return [...document.querySelectorAll('#tasks-table tbody tr')]
    .map(tr => [...tr.querySelectorAll('td')].map(td => td.innerText.replace(/\n/g, '').trim()))
    .filter(cells => cells.length === columns.length)
    .map(cells => Object.fromEntries(columns.map((c, i) => [c, cells[i]])));
"""

# Every column but the last, the worker's (its width follows the host name), ends in view.
IN_VIEW = """
const right = document.querySelector('#tasks-table').closest('.dataTables_scrollBody')
    .getBoundingClientRect().right;
return [...document.querySelectorAll('#tasks-table tbody tr')].every(tr =>
    [...tr.querySelectorAll('td')].slice(0, -1)
        .every(td => td.getBoundingClientRect().right <= right));
"""


@dataclass
class FlowerServer:
    url: str
    user: str
    password: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def flower(
    session_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlowerServer]:
    """`baton flower` on a free port with a fresh login, once it receives the worker's events."""
    log = tmp_path_factory.mktemp("flower") / "flower.log"
    port = services.free_port()
    user, password = "operator", secrets.token_urlsafe(16)
    env = {
        **os.environ,
        "BATON_REDIS_URL": session_stack.settings.require_redis_url(),
        "BATON_FLOWER_USER": user,
        "BATON_FLOWER_PASSWORD": password,
    }
    argv = [sys.executable, "-m", "orchestrator.control.cli", "flower", "--port", str(port),
            "--address", "127.0.0.1"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = FlowerServer(f"http://127.0.0.1:{port}", user, password, proc, log)
    try:
        wait_for_worker_events(server)
        yield server
    finally:
        services.stop(proc)


def wait_for_worker_events(server: FlowerServer, timeout_s: float = 60.0) -> None:
    """Flower sees only events sent after it subscribed: wait for a worker heartbeat to show in
    /metrics (which needs no login)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log.read_text(errors="replace")[-2000:]
        try:
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        except httpx.TransportError:
            metrics = ""
        if 'flower_worker_online{worker="' in metrics:
            return
        time.sleep(0.5)
    raise AssertionError(f"Flower saw no worker within {timeout_s:.0f}s; see {server.log}")


def log_in(driver: webdriver.Chrome, server: FlowerServer) -> None:
    """Basic auth on every request the page makes, the table's XHRs included."""
    token = base64.b64encode(f"{server.user}:{server.password}".encode()).decode()
    login = f"Basic {token}"
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": login}})


def tasks_page(driver: webdriver.Chrome, server: FlowerServer) -> list[dict[str, str]]:
    """Loads the Tasks page and returns its rows once the table has drawn."""
    driver.get(f"{server.url}/tasks")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        drawn = driver.execute_script(
            "return document.querySelector('#tasks-table_info')?.innerText || ''"
        )
        if drawn.startswith(("Showing", "No tasks")):
            rows: list[dict[str, str]] = driver.execute_script(READ_TASKS_TABLE)
            return rows
        time.sleep(0.2)
    raise AssertionError(f"the Tasks page did not draw its table: {driver.page_source[:2000]}")


def stage_rows(rows: list[dict[str, str]], run_id: str) -> dict[str, dict[str, str]]:
    return {row["uuid"].removeprefix(f"{run_id}."): row for row in rows if run_id in row["uuid"]}


@pytest.mark.timeout(240)
def test_a_logged_in_browser_follows_every_stage_of_a_run_on_the_tasks_page(
    stack: Stack, flower: FlowerServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    log_in(browser, flower)
    tasks_page(browser, flower)
    assert "Task history" in browser.page_source

    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo())
    deadline, shown = time.monotonic() + 180, {}
    while time.monotonic() < deadline:
        shown = stage_rows(tasks_page(browser, flower), run_id)
        if set(shown) == set(STAGES) and all(r["state"] == "SUCCESS" for r in shown.values()):
            break
        time.sleep(2)
    screenshot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "flower.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(screenshot)), f"no screenshot written to {screenshot}"
    in_view = browser.execute_script(IN_VIEW)

    assert api.get_run(run_id, settings=stack.settings).status is RunStatus.DONE
    assert sorted(shown) == sorted(STAGES), shown
    for stage, row in shown.items():
        assert row["name"] == f"baton.fixer.{stage}"
        assert row["uuid"] == f"{run_id}.{stage}"
        assert row["state"] == "SUCCESS"
        assert row["worker"].startswith("baton-worker-")
        assert row["runtime"]
    assert in_view, "a column is out of sight: the Tasks page must be scrolled sideways"
    # What the search box does: the run id finds the run's stages (it is in their args).
    found = httpx.get(
        f"{flower.url}/api/tasks",
        params={"search": run_id},
        auth=(flower.user, flower.password),
        timeout=10,
    ).json()
    assert sorted(task["name"] for task in found.values()) == sorted(
        f"baton.fixer.{s}" for s in STAGES
    )


@pytest.mark.timeout(240)
def test_flower_shows_each_iteration_of_a_looped_stage_as_its_own_task(
    stack: Stack, flower: FlowerServer
) -> None:
    stack.fake.set_scenario(wrong_fix_first())  # the first fix fails its proof, the second not
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()), 150)
    assert run.status is RunStatus.DONE, run.reason

    deadline, found = time.monotonic() + 30, {}
    while time.monotonic() < deadline and len(found) < len(STAGES) + 1:
        found = httpx.get(f"{flower.url}/api/tasks", params={"search": run.id},
                          auth=(flower.user, flower.password), timeout=10).json()  # fmt: skip
        time.sleep(0.5)

    fixes = {uuid: task for uuid, task in found.items() if task["name"] == "baton.fixer.fix"}
    assert sorted(fixes) == [f"{run.id}.fix", f"{run.id}.fix.2"]
    assert {task["state"] for task in fixes.values()} == {"SUCCESS"}


def test_flower_refuses_a_wrong_password_but_answers_health_checks(flower: FlowerServer) -> None:
    wrong = httpx.get(f"{flower.url}/tasks", auth=(flower.user, "not-the-password"), timeout=10)
    anonymous = httpx.get(f"{flower.url}/api/tasks", timeout=10)
    right = httpx.get(f"{flower.url}/api/workers", auth=(flower.user, flower.password), timeout=10)
    health = httpx.get(f"{flower.url}/healthcheck", timeout=10)

    assert (wrong.status_code, anonymous.status_code) == (401, 401)
    assert right.status_code == 200
    assert (health.status_code, health.text) == (200, "OK")
    cmdline = Path(f"/proc/{flower.proc.pid}/cmdline").read_bytes()
    assert b"celery\x00-A\x00orchestrator.control.flower_app\x00flower" in cmdline
    assert flower.password.encode() not in cmdline + flower.log.read_bytes()


def test_flower_refuses_to_start_without_a_login(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_FLOWER_")}
    env["BATON_REDIS_URL"] = "redis://127.0.0.1:1/0"
    refused = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "flower"],
        env=env, capture_output=True, timeout=60,
    )  # fmt: skip

    assert refused.returncode == 2
    message = refused.stderr.decode().strip()
    assert "\n" not in message
    assert "BATON_FLOWER_USER" in message and "BATON_FLOWER_PASSWORD" in message
    assert "--no-auth" in message
