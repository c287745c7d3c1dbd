"""The baseline of the overhead benchmark: a plain Celery chain whose every task makes one
google-genai call to the same fake server, on the same Redis and with the same worker settings
as Baton (acks late, prefetch 1, prefork), the same garbage collector settings in its pool
process (`orchestrator.queue.collect_less`) and google-genai's request building without its walk
through every field (`workers.genai_paths`), as in Baton's worker. One client per process,
reused; task starts traced (`bench.trace`) as in Baton's worker.
"""

from __future__ import annotations

import functools
import os

from celery import Celery
from celery.signals import worker_process_init
from google import genai
from google.genai import types

from bench import trace
from bench.stack import API_KEY
from orchestrator.queue import celery_config, collect_less
from orchestrator.settings import DEFAULT_MODEL, QueueConfig
from workers import genai_paths

MODEL = DEFAULT_MODEL
"""The model each chain task calls, as a Baton worker would by default."""

app = Celery("bench-chain")
app.conf.update(celery_config(os.environ["BATON_REDIS_URL"], QueueConfig()))
trace.install()
worker_process_init.connect(collect_less, weak=False)  # as Baton's worker does
genai_paths.install()


@functools.cache
def client() -> genai.Client:
    options = types.HttpOptions(
        base_url=os.environ["BENCH_GEMINI_URL"],
        api_version="v1beta",
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(api_key=API_KEY, http_options=options)


@app.task(name="bench.stage")
def stage(previous: str | None, name: str) -> str:
    """One model call; the reply's text goes to the next task of the chain."""
    prompt = f"Stage {name}." + (f" Before you: {previous}" if previous else "")
    config = types.GenerateContentConfig(
        system_instruction=f'You are an agent. Your internal name is "{name}".'
    )
    reply = client().models.generate_content(model=MODEL, contents=prompt, config=config)
    return reply.text or ""
