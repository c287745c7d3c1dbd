"""What the overhead benchmark's two baseline workers (`bench.chain_app`, `bench.adk_chain_app`)
set up alike, with every CPU saving Baton's worker has: a Celery app with Baton's settings on the
same Redis, task starts traced (`bench.trace`), Baton's garbage collector settings in the pool
process (`orchestrator.core.queue.collect_less`), and one google-genai client per process."""

from __future__ import annotations

import functools
import os

from celery import Celery
from celery.signals import worker_process_init
from google import genai
from google.genai import types

from bench import trace
from bench.stack import API_KEY
from orchestrator.core.queue import celery_config, collect_less
from orchestrator.core.settings import QueueConfig


def worker_app(name: str) -> Celery:
    """The Celery app of a baseline worker (its entry point calls this once)."""
    app = Celery(name)
    app.conf.update(celery_config(os.environ["BATON_REDIS_URL"], QueueConfig()))
    trace.install()
    worker_process_init.connect(collect_less, weak=False)  # as Baton's worker does
    return app


@functools.cache
def client() -> genai.Client:
    """The process's one client of the fake server, reused by every task."""
    options = types.HttpOptions(
        base_url=os.environ["BENCH_GEMINI_URL"],
        api_version="v1beta",
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(api_key=API_KEY, http_options=options)
