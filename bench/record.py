"""Where benchmark results go: `bench/results/<benchmark>.json`, the latest run's figures, and a
line of `bench/results/history/<benchmark>.jsonl`, every recorded run's. The docs' sections are
drawn from these files (`bench.docs`), never written by a benchmark itself."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.git import code_digest, source_stamp, uncommitted

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HISTORY = RESULTS / "history"
SHARED = ("bench/record.py", "requirements.lock")
"""What every benchmark's figures depend on besides its own code: how they are recorded and
the exact versions of every dependency. Each benchmark's `CODE` (repo-relative paths, folders
ending in `/`) names these and the rest of the code whose change would change its figures; a
results file is stale once a later commit touches them (`bench.stale`)."""
STACK = ("bench/stack.py", "orchestrator/", "workers/", "testkit/")
"""The code a benchmark that runs Baton's stack (redis, Celery workers, the fake Gemini server)
measures."""


def commit(code: Sequence[str], root: Path = ROOT) -> str:
    """The short sha of the checkout the benchmark ran from, ending `-dirty` when its `code` has
    uncommitted changes; "unknown" outside a clone."""
    return source_stamp(root, code)


def dirty(code: Sequence[str], root: Path = ROOT) -> list[str]:
    """The files of `code` with uncommitted changes: a run now would measure code no commit
    holds."""
    return uncommitted(root, code)


def save(
    name: str, figures: Mapping[str, Any], code: Sequence[str], results: Path = RESULTS
) -> Path:
    """Write a run's figures as `<name>.json` (with its date, the commit of its `code` and the
    digest of that code, `code_digest`) and add them to the benchmark's history; the path
    written."""
    stamped = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(code),
        "code": code_digest(ROOT, code),
        **figures,
    }
    (results / "history").mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps(stamped, indent=2, ensure_ascii=False) + "\n")
    with (results / "history" / f"{name}.jsonl").open("a") as history:
        history.write(json.dumps(stamped, ensure_ascii=False) + "\n")
    return path


def percentile(values: Sequence[float], q: float) -> float:
    """The value at quantile `q` (0.95: the 95th percentile) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
