"""The whole stack for real: redis-server, a Celery worker subprocess (prefork), the fake Gemini
server reached through the real google-genai client, git repositories on disk; headless
Chromium for the web pages."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from demo import SCENARIO, SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CANARY_KEY = "AIza-canary-key-0123456789"
"""The API key the tests hand the client: it must never show up in a recorded request."""
WINDOW = (1400, 900)
"""The browser window's size (its viewport is smaller by the window's frame)."""
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync",
)  # fmt: skip


def demo_scenario() -> dict[str, Any]:
    scenario: dict[str, Any] = json.loads(SCENARIO.read_text())
    return scenario


def wrong_fix_first() -> dict[str, Any]:
    """The demo, but the fix's first iteration makes a wrong change (its reproducing test still
    fails) and the second, told of the first, makes the right one."""
    scenario = demo_scenario()
    right = scenario["agents"]["fix"]["steps"]
    wrong = json.loads(json.dumps(right))
    wrong[1]["call"]["args"]["new_text"] = "        return -1\n"
    scenario["agents"]["fix"] = {
        "steps": wrong,
        "variants": [{"when": "Your previous attempt (iteration 1 of 3)", "steps": right}],
    }
    return scenario


@dataclass
class Stack:
    settings: Settings
    fake: FakeGemini
    workdir: Path

    def sample_repo(self) -> Path:
        return make_sample_repo(self.workdir / f"shopcart-{time.monotonic_ns()}")

    def enqueue(self, payload: bytes | str, repo: Path, **kwargs: Any) -> str:
        return api.enqueue(payload, repo=str(repo), settings=self.settings, force=True, **kwargs)

    def wait(self, run_id: str, timeout_s: float = 90.0) -> RunRecord:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = api.get_run(run_id, settings=self.settings)
            if run.status.is_terminal:
                return run
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} did not end within {timeout_s}s: {run.status}")

    def requests(self, agent: str | None = None) -> list[dict[str, Any]]:
        entries = self.fake.requests()
        return [e for e in entries if agent is None or e["agent"] == agent]


def start_worker(settings: Settings, logfile: Path, **env: str) -> Any:
    queues = [stage.queue for stage in load_pipeline("fixer").stages]
    return services.worker({**worker_env(settings), **env}, queues, logfile=logfile)


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGemini]:
    record = tmp_path_factory.mktemp("fake") / "requests.jsonl"
    with FakeGemini.start(demo_scenario(), record_path=record) as fake:
        yield fake


def stack_settings(redis_url: str, fake: FakeGemini, workdir: Path) -> Settings:
    return Settings(
        redis_url=redis_url,
        gemini_base_url=fake.url,
        google_api_key=SecretStr(CANARY_KEY),
        repo_cache_dir=workdir / "repo-cache",
    )


@pytest.fixture(scope="session")
def session_stack(
    redis_url: str, fake_server: FakeGemini, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    settings = stack_settings(redis_url, fake_server, workdir)
    with start_worker(settings, workdir / "worker.log"):
        yield Stack(settings, fake_server, workdir)


@pytest.fixture
def stack(session_stack: Stack) -> Iterator[Stack]:
    """The shared worker and fake server, with the demo scenario and no faults."""
    session_stack.fake.set_scenario(demo_scenario())
    session_stack.fake.reset()
    yield session_stack
    session_stack.fake.set_scenario(demo_scenario())


@pytest.fixture
def run_store(session_stack: Stack) -> Iterator[RunStore]:
    """The store the worker writes to (database 0, never flushed)."""
    store = RunStore.from_url(session_stack.settings.require_redis_url())
    yield store
    store.redis.close()


@pytest.fixture(scope="session")
def demo_run(session_stack: Stack) -> RunRecord:
    """The demo's Sentry event fixed end to end by the session worker, once a session: the
    read-only checks of the CLI's and the web UI's views of a run all look at this one."""
    session_stack.fake.set_scenario(demo_scenario())
    session_stack.fake.reset()
    run_id = session_stack.enqueue(SENTRY_EVENT.read_bytes(), session_stack.sample_repo())
    run = session_stack.wait(run_id, 150)
    assert run.status is RunStatus.DONE, run.reason
    return run


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium; it must be installed (make setup), so a missing one fails the test.
    Its console is kept (`browser.get_log("browser")`)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "apt-get install chromium chromium-driver (make setup)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_window_size(*WINDOW)
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
