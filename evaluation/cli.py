"""`baton eval`, added to the `baton` command by entry point (it needs the fake Gemini server for
its scripted policies: the `fake` extra)."""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from evaluation.policies import KINDS, expand
from orchestrator.core.errors import BatonError
from orchestrator.core.settings import Settings

if TYPE_CHECKING:
    from evaluation.corpus import Instance

DOWNLOADS = Path("build") / "eval-downloads"


@click.command("eval")
@click.argument("corpus", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--repos", "repos_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="For a SWE-bench file: the folder holding its repositories, each a git directory "
    "(bare or not) named owner+name or name.",
)  # fmt: skip
@click.option(
    "--repo", "repo_given", multiple=True, metavar="OWNER/NAME=PATH_OR_URL",
    help="For a SWE-bench file: where one repository is, a local path or a clone URL "
    "(repeatable; before --repos).",
)  # fmt: skip
@click.option(
    "--mode", "modes", multiple=True,
    type=click.Choice(["oracle", "saboteur", *(f"saboteur:{k}" for k in KINDS), "stale", "model"]),
    help="Who plays the model: the oracle (gold patches), the saboteur (a plausible wrong "
    "fix: `saboteur` plays every kind, `saboteur:KIND` one), stale (a reproduction by tests "
    "that already pass), or the model GOOGLE_API_KEY reaches. Repeatable. Default: model with "
    "a key, else oracle.",
)  # fmt: skip
@click.option("--only", multiple=True, help="Just this instance id (repeatable).")
@click.option("--concurrency", default=2, show_default=True, help="Runs at once.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--results",
    "results_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the results file here (JSON: date, commit, command, each mode's "
    "totals, every instance's result); `make eval` writes eval/results/eval.json, "
    "which `make docs` draws docs/eval.md from.",
)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a markdown report here.")  # fmt: skip
@click.option("--timeout", default=1200.0, show_default=True, help="Seconds one run may take.")
def eval_command(
    corpus: Path,
    repos_dir: Path | None,
    repo_given: tuple[str, ...],
    modes: tuple[str, ...],
    only: tuple[str, ...],
    concurrency: int,
    as_json: bool,
    results_path: Path | None,
    report: Path | None,
    timeout: float,
) -> None:
    """Run the instances of CORPUS through the fixer pipeline and measure which are resolved.

    CORPUS is a folder of instance folders, or a SWE-bench file (`.jsonl`, or `.json` holding
    a list) whose repositories --repos or --repo say where to find.

    Exits 0 when the measurement ran, whatever it found; 2 when the corpus is invalid.
    """
    from evaluation import report as reports
    from evaluation.harness import evaluate

    settings = Settings()
    chosen = expand(list(modes) or ["model" if settings.google_api_key else "oracle"])
    err = Console(stderr=True)
    with ExitStack() as stack:
        try:
            instances = _instances(corpus, only, repos_dir, repo_given, stack)
        except BatonError as exc:
            err.print(f"[red]baton eval:[/] {exc}", markup=True, highlight=False)
            sys.exit(2)
        evaluation = evaluate(
            instances, chosen, corpus=str(corpus), concurrency=concurrency, settings=settings,  # type: ignore[arg-type]
            say=lambda line: err.print(line, markup=False, highlight=False),
            run_timeout_s=timeout, downloads=DOWNLOADS.resolve(),
        )  # fmt: skip
    if as_json:
        click.echo(evaluation.as_json())
    else:
        console = Console()
        for table in reports.tables(evaluation, width=console.width):
            console.print(table)
    if results_path is None and report is None:
        return
    command = "baton eval " + " ".join(
        [str(corpus), *(f"--mode {m}" for m in chosen), f"--concurrency {concurrency}",
         *(f"--only {i}" for i in only), *([f"--repos {repos_dir}"] if repos_dir else []),
         *(f"--repo {r}" for r in repo_given)]
    )  # fmt: skip
    machine = f"{platform.machine()}, Python {platform.python_version()}"
    results = reports.results_file(
        evaluation,
        command=command,
        environment=machine,
        commit=reports.source_commit(),
        code=reports.source_code(),
    )
    for path in (results_path, report):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    if results_path is not None:
        results_path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        err.print(f"wrote {results_path}")
    if report is not None:
        saved = str(results_path) if results_path is not None else None
        report.write_text(reports.markdown(reports.ResultsFile(saved, results)))
        err.print(f"wrote {report}")


def _instances(
    corpus: Path,
    only: tuple[str, ...],
    repos_dir: Path | None,
    repo_given: tuple[str, ...],
    stack: ExitStack,
) -> list[Instance]:
    """A folder's instances, or a SWE-bench file's, written into a folder kept until `stack`
    closes."""
    from evaluation.corpus import CorpusError, load_corpus
    from evaluation.swebench import Repos, load_records, parse_repo_option

    if corpus.is_dir():
        if repos_dir is not None or repo_given:
            raise CorpusError("--repos and --repo are for a SWE-bench file, not a folder")
        return load_corpus(corpus, only)
    repos = Repos(repos_dir, parse_repo_option(repo_given))
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-swebench-")))
    return load_records(corpus, repos, work, only)
