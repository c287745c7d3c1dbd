"""The demo: a sample repository with a real bug, a Sentry event captured from it by the real
sentry-sdk, and the scenario the fake Gemini server plays for it."""

from pathlib import Path

HERE = Path(__file__).parent
SAMPLE_REPO = HERE / "sample_repo"
"""A small Python package (`shopcart`) whose empty cart crashes, with a failing test."""
SENTRY_EVENT = HERE / "sentry_event.json"
"""Made by `python -m demo.make_sentry_event`."""
SCENARIO = HERE / "scenario.json"
"""What the fake Gemini server answers each stage of the demo."""
