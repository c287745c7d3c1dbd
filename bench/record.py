"""Where benchmark results go: a JSON file per benchmark and a row in docs/benchmarks.md."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.git import run_git

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"


def commit() -> str:
    """The short sha of the checkout the benchmark ran from, or "unknown" outside a clone."""
    done = run_git(["-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return done.stdout.decode().strip() if done.returncode == 0 else "unknown"


def save(name: str, figures: Mapping[str, Any], row: Sequence[str], detail: str) -> Path:
    """Write the figures, append `row` to the section's table and replace its detail block."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    path = RESULTS / f"{name}.json"
    path.write_text(
        json.dumps({"benchmark": name, "date": stamp, "commit": commit(), **figures}, indent=2)
        + "\n"
    )
    text = DOC.read_text()
    text = _append_row(text, name, [stamp, commit(), *row])
    text = _replace_block(text, f"detail:{name}", detail)
    DOC.write_text(text)
    return path


def percentile(values: Sequence[float], q: float) -> float:
    """The value at quantile `q` (0.95: the 95th percentile) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def targets_table(targets: Mapping[str, Mapping[str, Any]]) -> str:
    """A benchmark's `targets` (name → value, target, met) as a table."""
    return table(
        ["target", "value", "met"],
        [[name, f"{t['value']} (target {t['target']})", "yes" if t["met"] else "**no**"]
         for name, t in targets.items()],
    )  # fmt: skip


def _append_row(text: str, name: str, cells: Sequence[str]) -> str:
    end = f"<!-- /table:{name} -->"
    if end not in text:
        raise ValueError(f"{DOC} has no {end} marker")
    return text.replace(end, "| " + " | ".join(cells) + " |\n" + end)


def _replace_block(text: str, marker: str, body: str) -> str:
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    if start not in text or end not in text:
        raise ValueError(f"{DOC} has no {start} … {end} block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"
