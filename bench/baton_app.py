"""Baton's own worker app (`workers.app`) with task starts traced (`bench.trace`): the overhead
benchmark runs its Baton worker as `celery -A bench.baton_app worker`, nothing else changed."""

from __future__ import annotations

from bench import trace
from workers.app import app

trace.install()

__all__ = ["app"]
