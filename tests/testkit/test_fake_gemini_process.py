"""`python -m testkit.gemini` as a separate process, the way the demo and workers run it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from google import genai
from google.genai import types

REPO_ROOT = Path(__file__).resolve().parents[2]
ADDRESS_PREFIX = "fake-gemini listening on http://127.0.0.1:"


def read_line(stream: IO[str], timeout_s: float) -> str:
    """The next line of `stream`, or "" if none arrives in time."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0] if lines else ""


def test_the_module_prints_its_address_serves_and_exits_zero_on_sigterm(tmp_path: Path) -> None:
    scenario_path = tmp_path / "scenario.json"
    scenario_path.write_text(json.dumps({"agents": {"*": [{"text": "from a process"}]}}))
    record_path = tmp_path / "requests.jsonl"
    command = [sys.executable, "-m", "testkit.gemini", "--scenario", str(scenario_path)]
    command += ["--record", str(record_path)]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = read_line(process.stdout, timeout_s=20)
        assert line.startswith(ADDRESS_PREFIX), line
        options = types.HttpOptions(
            base_url=line.removeprefix("fake-gemini listening on ").strip(),
            api_version="v1beta",
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        client = genai.Client(api_key="fake-key", http_options=options)

        response = client.models.generate_content(model="gemini-3.8-flash", contents="hi")
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=10)
    finally:
        process.kill()
        process.communicate()

    assert response.text == "from a process"
    assert returncode == 0
    assert len(record_path.read_text(encoding="utf-8").splitlines()) == 1


def test_the_module_exits_2_naming_a_scenario_it_cannot_load(tmp_path: Path) -> None:
    scenario_path = tmp_path / "scenario.json"
    scenario_path.write_text(json.dumps({"agents": {"*": [{"text": "a", "json": 1}]}}))

    result = subprocess.run(
        [sys.executable, "-m", "testkit.gemini", "--scenario", str(scenario_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert str(scenario_path) in result.stderr
    assert result.stdout == ""
