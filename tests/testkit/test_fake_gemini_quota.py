"""The fake Gemini server's quota, driven by the real google-genai client, and `scope: all`.

The server tells the time by a fake clock that the tests move on: a window is waited out by
moving the clock, not by sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from testkit.gemini import FakeGemini
from workers.gemini import retry_delay_s

MODEL = "gemini-2.5-flash"
OK: dict[str, Any] = {"agents": {"*": [{"text": "ok"}]}}
REQUEST_S = 0.33
"""How far the clock moves between two requests of a test, as if each took that long."""

ClientFor = Callable[..., genai.Client]


class FakeClock:
    """Seconds since the epoch, as `time.time` tells them, but moved only by the test."""

    def __init__(self, now_s: float = 1_700_000_000.05) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def advance_to_phase(self, window_s: float, phase_s: float) -> None:
        """Move on to `phase_s` into the next fixed window of `window_s` (from the epoch)."""
        self.advance(window_s - self.now_s % window_s + phase_s)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> Iterator[FakeGemini]:
    with FakeGemini.start(OK, clock=clock) as server:
        yield server


@pytest.fixture
def client(fake: FakeGemini, client_for: ClientFor) -> genai.Client:
    return client_for(fake)


def ask(client: genai.Client, agent: str = "default", model: str = MODEL) -> float | None:
    """Send one request; None when answered, the 429's retry delay (or -1.0) when refused."""
    try:
        headers = types.HttpOptions(headers={"x-baton-agent": agent})
        config = types.GenerateContentConfig(http_options=headers)
        client.models.generate_content(model=model, contents="hi", config=config)
    except errors.APIError as exc:
        if exc.code != 429:
            return -1.0
        return retry_delay_s(exc)
    return None


def statuses(fake: FakeGemini) -> list[int]:
    return [entry["status"] for entry in fake.requests()]


def with_quota(**quota: Any) -> dict[str, Any]:
    return {**OK, "quota": quota}


def test_requests_over_the_quota_get_a_429_with_the_time_until_the_window_has_room(
    fake: FakeGemini, client: genai.Client, clock: FakeClock
) -> None:
    fake.set_scenario(with_quota(requests_per_minute=2, window_s=2))

    answers = [ask(client)]
    for _ in range(2):
        clock.advance(REQUEST_S)
        answers.append(ask(client))
    delay = answers[2]
    assert delay is not None
    clock.advance(delay)
    answers.append(ask(client))

    assert answers[:2] == [None, None]
    first, refused = fake.requests()[0]["ts"], fake.requests()[2]["ts"]
    assert first + 2.0 - refused <= delay < first + 2.0 - refused + 0.1
    assert round(delay * 10) == pytest.approx(delay * 10)
    assert answers[3] is None
    assert statuses(fake) == [200, 200, 429, 200]


def test_each_model_has_its_own_window(fake: FakeGemini, client: genai.Client) -> None:
    fake.set_scenario(with_quota(requests_per_minute=1))

    answers = [ask(client), ask(client, model="gemini-2.5-pro"), ask(client)]

    assert answers[:2] == [None, None]
    assert answers[2] is not None
    assert statuses(fake) == [200, 200, 429]


def test_tokens_over_the_quota_count_the_prompt_and_reply_of_what_was_answered(
    fake: FakeGemini, client: genai.Client, clock: FakeClock
) -> None:
    fake.set_scenario(with_quota(tokens_per_minute=1_000_000))
    ask(client)
    clock.advance(REQUEST_S)
    answered = fake.requests()[0]
    used, prompt = (
        answered["prompt_tokens"] + answered["candidates_tokens"],
        answered["prompt_tokens"],
    )

    fake.set_scenario(with_quota(tokens_per_minute=used + prompt - 1))
    refused = ask(client)
    fake.set_scenario(with_quota(tokens_per_minute=used + prompt))
    fits = ask(client)

    assert refused is not None and 59.0 < refused <= 60.0
    assert fits is None
    assert statuses(fake) == [200, 429, 200]


def test_the_quota_comes_before_the_faults_and_a_failed_request_gives_its_place_back(
    fake: FakeGemini, client: genai.Client, clock: FakeClock
) -> None:
    scenario = with_quota(requests_per_minute=1, window_s=1)
    fake.set_scenario({**scenario, "faults": [{"requests": [2], "status": 503}]})

    ask(client)
    ask(client)
    clock.advance(1.1)
    ask(client)
    ask(client)

    assert statuses(fake) == [200, 429, 503, 200]


def test_a_scenario_without_a_quota_answers_everything(client: genai.Client) -> None:
    answers = [ask(client) for _ in range(20)]

    assert answers == [None] * 20


@pytest.mark.parametrize(
    ("scope", "expected"),
    [("all", [200, 503, 200, 503]), ("agent", [200, 200, 503, 503])],
)
def test_scope_says_whether_every_counts_all_requests_or_the_agents_own(
    fake: FakeGemini, client: genai.Client, scope: str, expected: list[int]
) -> None:
    fake.set_faults([{"every": 2, "scope": scope, "status": 503}])

    for agent in ["triage", "plan", "triage", "plan"]:
        ask(client, agent)

    assert [e["agent"] for e in fake.requests()] == ["triage", "plan", "triage", "plan"]
    assert statuses(fake) == expected


def test_a_fixed_window_admits_a_whole_quota_again_as_soon_as_the_next_window_starts(
    fake: FakeGemini, client: genai.Client, clock: FakeClock
) -> None:
    fake.set_scenario(with_quota(requests_per_minute=2, window_s=2, window="fixed"))

    clock.advance_to_phase(2.0, 1.0)
    late = [ask(client)]
    for _ in range(2):
        clock.advance(REQUEST_S)
        late.append(ask(client))
    clock.advance_to_phase(2.0, 0.1)
    early = [ask(client), ask(client)]

    refused = fake.requests()[2]
    until_end = (refused["ts"] // 2 + 1) * 2 - refused["ts"]
    assert late[:2] == [None, None]
    assert late[2] is not None and until_end <= late[2] < until_end + 0.1
    assert early == [None, None], "a sliding window would still count the two answered late"
    assert statuses(fake) == [200, 200, 429, 200, 200]
