"""`python -m bench.stale [--json]`: which results files measured code that has changed since.

Every results file records the commit it was measured at (`bench.record.commit`,
`evaluation.report.source_commit`), and the code that measurement depends on is named in one
place, `measured`: each benchmark's `CODE` for `bench/results/<name>.json`, `evaluation.report.CODE`
for every `eval/results/*.json`. A results file is stale when a commit after its own changed any
of those paths, and also when that cannot be told: its commit is unknown or ends `-dirty`
(measured from uncommitted code). A results file that keeps the digest of its code
(`orchestrator.core.git.code_digest`, `code`) is fresh exactly when that digest is HEAD's, which
HEAD's tree alone tells (a shallow clone too); one that keeps none is held to history: fresh when
no commit since its own changed those paths (`git log <recorded>..HEAD -- <paths>`), stale when
its commit is not an ancestor of HEAD or is missing from the clone. Prints a table (`--json`:
one object per file); exits 1 when any file is stale, so that scripts and CI can hold to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.core.git import DIRTY, code_digest, run_git

ROOT = Path(__file__).resolve().parent.parent
BENCH_RESULTS = "bench/results"
EVAL_RESULTS = "eval/results"


@dataclass(frozen=True)
class Freshness:
    """What is known of one results file's figures against the code at HEAD."""

    results: str
    """The results file, relative to the clone."""
    commit: str
    """The commit it records (`unknown` when it records none)."""
    stale: bool
    reason: str
    """Why it is stale, or `fresh`."""
    since: list[str] = field(default_factory=list)
    """The commits after its own that changed its code, newest first."""


def measured(root: Path = ROOT) -> dict[str, tuple[str, ...]]:
    """Each results file under `root` (repo-relative), and the code its figures depend on; a file
    that no benchmark or evaluation names maps to no code (and is stale)."""
    from bench.__main__ import BENCHMARKS
    from evaluation.report import CODE as EVALUATION

    found: dict[str, tuple[str, ...]] = {}
    for path in sorted((root / BENCH_RESULTS).glob("*.json")):
        module = BENCHMARKS.get(path.stem)
        found[f"{BENCH_RESULTS}/{path.name}"] = module.CODE if module is not None else ()
    for path in sorted((root / EVAL_RESULTS).glob("*.json")):
        found[f"{EVAL_RESULTS}/{path.name}"] = EVALUATION
    return found


def _git(root: Path, *args: str) -> tuple[bool, str]:
    done = run_git(["-C", str(root), *args])
    return done.returncode == 0, done.stdout.decode(errors="replace").strip()


def _recorded(root: Path, results: str) -> tuple[str, str | None]:
    """The commit a results file records ("unknown" when none) and its code's digest, if kept."""
    try:
        data = json.loads((root / results).read_text())
        commit, digest = data.get("commit"), data.get("code")
    except (OSError, ValueError, AttributeError):
        return "unknown", None
    return (str(commit) if commit else "unknown"), (str(digest) if digest else None)


def _unreadable(root: Path, commit: str) -> str | None:
    """Why `git log <commit>..HEAD` cannot say what changed since `commit`, if it cannot."""
    if commit == "unknown":
        return "its commit is unknown"
    if commit.endswith(DIRTY):
        return "measured from uncommitted code"
    _, shallow = _git(root, "rev-parse", "--is-shallow-repository")
    if not _git(root, "cat-file", "-e", f"{commit}^{{commit}}")[0]:
        if shallow == "true":
            return "its commit is not in this shallow clone (fetch with --unshallow)"
        return "its commit is not in this clone"
    if not _git(root, "merge-base", "--is-ancestor", commit, "HEAD")[0]:
        if shallow == "true":
            return "this shallow clone cannot tell whether its commit is an ancestor of HEAD"
        return "its commit is not an ancestor of HEAD"
    return None


def freshness(root: Path, results: str, code: Sequence[str]) -> Freshness:
    """Whether the figures of `results` still measure `code` as it is at HEAD in `root`."""
    commit, digest = _recorded(root, results)
    if not code:
        return Freshness(results, commit, stale=True, reason="no benchmark names its code")
    if digest is not None and commit != "unknown" and not commit.endswith(DIRTY):
        if digest == code_digest(root, code):
            return Freshness(results, commit, stale=False, reason="fresh")
        if _unreadable(root, commit) is not None:  # history cannot say which commits
            return Freshness(results, commit, stale=True, reason="its code changed since")
    unreadable = _unreadable(root, commit)
    if unreadable is not None:
        return Freshness(results, commit, stale=True, reason=unreadable)
    ok, out = _git(root, "log", "--format=%h", f"{commit}..HEAD", "--", *code)
    if not ok:
        return Freshness(results, commit, stale=True, reason="git log failed")
    since = out.split()
    if since:
        reason = f"its code changed in {len(since)} later commits"
        return Freshness(results, commit, stale=True, reason=reason, since=since)
    return Freshness(results, commit, stale=False, reason="fresh")


def check(root: Path, mapping: Mapping[str, Sequence[str]]) -> list[Freshness]:
    """`freshness` of every results file of `mapping` (results file: its code)."""
    return [freshness(root, results, code) for results, code in mapping.items()]


def table(found: Sequence[Freshness]) -> Table:
    """The check as a person reads it: one row per results file."""
    table = Table("results", "commit", "stale", "why", "last change")
    for f in found:
        last = f.since[0] if f.since else "-"
        table.add_row(f.results, f.commit, "yes" if f.stale else "no", f.reason, last)
    return table


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stale", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object per file")
    args = parser.parse_args(argv)
    found = check(root, measured(root))
    if args.json:
        print(json.dumps([asdict(f) for f in found], indent=2))
    else:
        Console().print(table(found))
    return 1 if any(f.stale for f in found) else 0


if __name__ == "__main__":
    sys.exit(main())
