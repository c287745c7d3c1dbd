"""Where benchmark results go: `bench/results/<benchmark>.json`, the latest run's figures, and a
line of `bench/results/history/<benchmark>.jsonl`, every recorded run's. The docs' sections are
drawn from these files (`bench.docs`), never written by a benchmark itself."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.git import run_git

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HISTORY = RESULTS / "history"


def commit() -> str:
    """The short sha of the checkout the benchmark ran from, or "unknown" outside a clone."""
    done = run_git(["-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return done.stdout.decode().strip() if done.returncode == 0 else "unknown"


def save(name: str, figures: Mapping[str, Any], results: Path = RESULTS) -> Path:
    """Write a run's figures as `<name>.json` (with its date and commit) and add them to the
    benchmark's history; the path written."""
    stamped = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(),
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
