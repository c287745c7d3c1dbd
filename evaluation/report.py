"""An evaluation's results as people read them (a table, a markdown report), as scripts do
(`Evaluation.as_json`), and as the record of a run the docs are drawn from (`results_file`:
`make eval` writes eval/results/eval.json; `make docs` draws docs/eval.md from it through
`SECTIONS`)."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.table import Table

from evaluation.harness import Evaluation, Result, false_publication
from evaluation.policies import kind
from orchestrator.control.tables import Column, fitted_table
from orchestrator.core.git import code_digest, source_stamp

COLUMNS = (
    "instance", "env", "reproduced", "proven", "published", "resolved", "fail→pass",
    "pass→pass", "stopped at", "model calls", "tokens in/out", "iterations", "wall s",
)  # fmt: skip
SOURCE = Path(__file__).resolve().parent.parent
"""The checkout Baton runs from, when it runs from one (`source_commit`)."""
CODE: tuple[str, ...] = (
    "evaluation/", "eval/corpus/", "orchestrator/", "workers/", "sandbox/", "images/", "testkit/",
    "requirements.lock",
)  # fmt: skip
"""The code whose change would change an evaluation's figures (every eval/results/*.json;
`bench.stale`): the harness and its corpus, the pipeline it runs, the sandboxes and their
images, the fake model server, and every dependency's exact version."""


class Results(Protocol):
    """A results file as a section is drawn from it: its figures by key, and where they come
    from (`bench.docs.Source` is one; `ResultsFile` another)."""

    def __getitem__(self, key: str) -> Any: ...

    @property
    def stamp(self) -> str: ...


@dataclass(frozen=True)
class ResultsFile:
    """An evaluation's results file, read back (`baton eval --report`)."""

    path: str | None
    """Where it was saved (`--results`), if it was."""
    data: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def stamp(self) -> str:
        where = f"`{self.path}`, " if self.path else ""
        return f"{where}commit {self.data['commit']}, {self.data['date']}"


def _row(result: Result) -> list[str]:
    def mark(flag: bool) -> str:
        return "yes" if flag else "no"

    f2p, p2p = result.fail_to_pass, result.pass_to_pass
    return [
        result.instance, mark(result.environment), mark(result.reproduced), mark(result.proven),
        mark(result.published), "**yes**" if result.resolved else "no", f"{f2p[0]}/{f2p[1]}",
        f"{p2p[0]}/{p2p[1]}", result.stopped or "-", str(result.model_calls),
        f"{result.prompt_tokens:,}/{result.output_tokens:,}", str(result.iterations),
        f"{result.wall_s:.0f}",
    ]  # fmt: skip


def modes(evaluation: Evaluation) -> dict[str, dict[str, Any]]:
    """Per mode, in the order run: how many instances, and how many of them the pipeline
    reproduced, proved and published, and the harness found resolved; the false publications
    (`harness.false_publication`) and where the runs were stopped (`harness.stopped`)."""
    found = {}
    for mode in dict.fromkeys(r.mode for r in evaluation.results):
        mine = [r for r in evaluation.results if r.mode == mode]
        resolved = sum(r.resolved for r in mine)
        found[mode] = {
            "instances": len(mine),
            "reproduced": sum(r.reproduced for r in mine),
            "proven": sum(r.proven for r in mine),
            "published": sum(r.published for r in mine),
            "resolved": resolved,
            "resolved_share": round(resolved / len(mine), 4),
            "published_unresolved": sum(r.published and not r.resolved for r in mine),
            "false_publications": sum(false_publication(r) for r in mine),
            "stopped": dict(sorted(Counter(r.stopped for r in mine).items())),
            "wall_s": evaluation.wall_s.get(mode, 0.0),
        }
    return found


def summary(mode: str, figures: Mapping[str, Any]) -> str:
    """A mode's line: resolved, published, false publications, wall time."""
    false = figures.get("false_publications", figures["published_unresolved"])
    return (
        f"{mode}: {figures['resolved']} of {figures['instances']} resolved "
        f"({100 * figures['resolved_share']:.0f} %), {figures['published']} published, "
        f"{false} false publications, wall time {figures['wall_s']:.0f} s"
    )


DROPPED_FIRST = (
    "env", "model calls", "tokens in/out", "iterations", "reproduced", "wall s", "proven",
    "stopped at", "published",
)  # fmt: skip
"""The columns a narrow terminal leaves out, the first first; the instance and what the
harness measured of it (resolved, the tests) stay."""


def tables(evaluation: Evaluation, *, width: int | None = None) -> list[Table]:
    """A table per mode, fitted to `width` (None: every column)."""
    columns = [
        Column(name, justify="left" if name == "instance" else "right",
               drop=len(DROPPED_FIRST) - DROPPED_FIRST.index(name) if name in DROPPED_FIRST else 0)
        for name in COLUMNS
    ]  # fmt: skip
    found = []
    for mode, figures in modes(evaluation).items():
        rows = [
            [cell.replace("**", "") for cell in _row(result)]
            for result in evaluation.results
            if result.mode == mode
        ]
        title = summary(mode, figures)
        found.append(fitted_table(columns, rows, width=width, title=title, title_justify="left"))
    return found


def source_commit(root: Path = SOURCE) -> str:
    """The short sha of the checkout Baton runs from, ending `-dirty` when the code it
    evaluates (`CODE`) has uncommitted changes; "unknown" when it is installed."""
    return source_stamp(root, CODE)


def source_code(root: Path = SOURCE) -> str:
    """The digest of the code it evaluates (`CODE`) at HEAD (`code_digest`), which a results
    file keeps beside its commit (`bench.stale`)."""
    return code_digest(root, CODE)


def results_file(
    evaluation: Evaluation,
    *,
    command: str,
    environment: str,
    commit: str,
    code: str = "unknown",
    date: str | None = None,
) -> dict[str, Any]:
    """What `baton eval --results FILE` writes: when, from which commit (and the digest of its
    evaluated code, `source_code`) and how it ran, each mode's totals and every instance's
    result."""
    return {
        "date": date or time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "code": code,
        "command": command,
        "environment": environment,
        "corpus": evaluation.corpus,
        "modes": modes(evaluation),
        "results": [asdict(r) for r in evaluation.results],
    }


SAFETY = (
    "mode", "instances", "resolved", "proven", "published", "published, not resolved",
    "false publications", "stopped at",
)  # fmt: skip


def safety(results: Results) -> list[str]:
    """One row per mode (each saboteur's kind its own): the figures that say whether Baton
    publishes what it should not, and where each run was stopped."""
    lines = ["| " + " | ".join(SAFETY) + " |", "|" + "|".join("---" for _ in SAFETY) + "|"]
    for mode, f in results["modes"].items():
        stops = f.get("stopped", {}).items()
        where = ", ".join(f"{n} {place}" for place, n in stops if place) or "-"
        false = f.get("false_publications", f["published_unresolved"])
        lines.append(
            f"| {mode} | {f['instances']} | {f['resolved']} | {f['proven']} | {f['published']} "
            f"| {f['published_unresolved']} | **{false}** | {where} |"
        )
    return lines


COSTS = (
    "stage", "runs", "model calls", "tokens in/out", "seconds",
)  # fmt: skip
COSTED = "oracle"
"""The mode whose runs the cost table is drawn from: every stage of each runs to the end."""


def costs(entries: Sequence[Result], mode: str = COSTED) -> list[str]:
    """What each stage cost the runs of `mode` that were published, as the median run of each
    figure (the lower of the middle two: a figure a run recorded): its model calls and tokens
    (every iteration and round) and the seconds it took; nothing when no run recorded its
    stages."""
    runs = [r for r in entries if r.mode == mode and r.published and r.stage_s]
    if not runs:
        return []
    lines = [
        f"What each stage cost the {len(runs)} published runs of {mode} (medians):", "",
        "| " + " | ".join(COSTS) + " |", "|" + "|".join(["---"] + ["---:"] * 4) + "|",
    ]  # fmt: skip
    for stage in dict.fromkeys(name for r in runs for name in r.stage_s):
        mine = [r for r in runs if stage in r.stage_s]
        calls = statistics.median_low(r.stage_calls.get(stage, 0) for r in mine)
        tokens = [statistics.median_low(r.stage_tokens.get(stage, [0, 0])[i] for r in mine)
                  for i in (0, 1)]  # fmt: skip
        seconds = statistics.median_low(r.stage_s[stage] for r in mine)
        lines.append(
            f"| {stage} | {len(mine)} | {calls} | {tokens[0]:,}/{tokens[1]:,} | {seconds:.2f} |"
        )
    return [*lines, ""]


def report(results: Results) -> str:
    """The safety table (`safety`), what each stage cost the oracle's runs (`costs`), then per
    mode a summary heading and a table, then each run's reason when it ended short."""
    entries = [Result(**entry) for entry in results["results"]]
    lines = [*safety(results), "", *costs(entries)]
    for mode, figures in results["modes"].items():
        mine = [r for r in entries if r.mode == mode]
        lines += [f"## {summary(mode, figures)}", ""]
        lines.append("| " + " | ".join(COLUMNS) + " |")
        lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
        lines += ["| " + " | ".join(_row(r)) + " |" for r in mine]
        ended = [r for r in mine if r.reason]
        if ended:
            lines += ["", "Why runs ended short:", ""]
            lines += [f"- {r.instance}: {r.reason}" for r in ended]
        lines.append("")
    return (
        f"From {results.stamp}: `{results['command']}` ({results['environment']}).\n\n"
        + "\n".join(lines)
    )


def proof(results: Results) -> str:
    """What the evaluation found of Baton's proof: what became of the oracle's fixes, each
    saboteur's kind and a stale reproduction."""
    said = {
        "oracle": "the oracle's gold patches: proven in {proven} of {instances}, published in "
        "{published}, resolved in {resolved}",
        "saboteur": "the saboteur's wrong fixes ({kind}): proven in {proven} of {instances}, "
        "published in {published} ({false} false publications)",
        "stale": "a reproduction by tests that already pass: accepted in {reproduced} of "
        "{instances}, published in {published}",
    }  # fmt: skip
    found = []
    for mode, f in results["modes"].items():
        head = "saboteur" if kind(mode) is not None or mode == "saboteur" else mode
        if head in said:
            false = f.get("false_publications", f["published_unresolved"])
            found.append(said[head].format(**f, kind=kind(mode) or "marker", false=false))
    return f"Measured by `make eval` ({results.stamp}): " + "; ".join(found) + "."


SECTIONS: Mapping[str, Callable[[Results], str]] = {"report": report, "proof": proof}
"""The sections of README.md and docs/ drawn from an evaluation's results file (`make docs`)."""


def markdown(results: Results) -> str:
    """A standalone report of one results file (`baton eval --report FILE`)."""
    return (
        "# Evaluation\n\n*Resolved* is measured by the harness itself: the instance's hidden "
        "FAIL_TO_PASS tests pass and its PASS_TO_PASS tests still pass, with the run's change "
        "applied in a clean sandbox; *proven* and *published* are what the pipeline claimed.\n\n"
        + report(results)
    )
