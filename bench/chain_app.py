"""The baseline of the overhead benchmark: a plain Celery chain whose every task makes one
google-genai call to the same fake server, on the same Redis and with the same worker settings
as Baton (acks late, prefetch 1, prefork) and every CPU saving Baton's worker has
(`bench.baseline`): one client per process, reused; task starts traced as in Baton's worker.
"""

from __future__ import annotations

from typing import Any

from celery import group
from google.genai import types

from bench.baseline import client, worker_app
from orchestrator.core.settings import DEFAULT_MODEL

MODEL = DEFAULT_MODEL
"""The model each chain task calls, as a Baton worker would by default."""

app = worker_app("bench-chain")


@app.task(name="bench.stage")
def stage(previous: str | None, name: str) -> str:
    """One model call; the reply's text goes to the next task of the chain."""
    prompt = f"Stage {name}." + (f" Before you: {previous}" if previous else "")
    config = types.GenerateContentConfig(
        system_instruction=f'You are an agent. Your internal name is "{name}".'
    )
    reply = client().models.generate_content(model=MODEL, contents=prompt, config=config)
    return reply.text or ""


@app.task(name="bench.fan_out", bind=True)
def fan_out(self: Any, prefix: str, count: int) -> None:
    """The fan-out benchmark's baseline (`bench.fanout`): one model call, then a Celery group
    of `count` tasks, `<prefix>.b1` … `<prefix>.b<count>`, on this task's queue."""
    reply = stage(None, "p0")
    queue = self.request.delivery_info.get("routing_key")
    group(
        stage.signature((reply, f"b{k}"), queue=queue, task_id=f"{prefix}.b{k}")
        for k in range(1, count + 1)
    ).apply_async()
