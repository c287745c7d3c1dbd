"""`baton env`, added to the `baton` command by entry point: the repositories' environments.

baton env build REPO [--ref R] [--env FILE]   build and validate, with progress
baton env detect REPO [--ref R] [--json]     the spec it would use, as TOML to start from
baton env ls [--json]                        what is built: key, repository, size, baseline
baton env prune [--older-than DAYS]          remove images not used for that long
baton env shell REPO [--ref R]               a shell in the agent phase's sandbox

A failure is never a traceback: one line naming what failed (the setup command and its exit
status), the tail of its output, and where the whole log was written; the exit status is 1 for
a failed build or validation, 2 for bad input (a spec, a repository, a ref) and 3 when Docker or
Redis does not answer — `baton`'s own statuses (Baton's errors and Redis's are said by the
`baton` command itself, which runs this group).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import docker
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import sandbox
from orchestrator.core.git import repo_source, resolve_commit
from orchestrator.core.store import connect
from sandbox.build import EnvironmentBuildError, EnvironmentValidationError, agent_config
from sandbox.detection import detection
from sandbox.environment import SPEC_FILE, load, to_toml
from sandbox.errors import EnvironmentSpecError, SandboxStartError, SandboxUnavailableError
from workers.environments import Environments, unpack_files
from workers.mirrors import RepoCache, repo_key
from workers.settings import WorkerSettings

out, err = Console(), Console(stderr=True)

EXIT_FAILED = 1
"""A build or its validation failed."""
EXIT_BAD_INPUT = 2
"""What was given is wrong; `baton`'s own status for it (a test holds the two equal)."""
EXIT_UNREACHABLE = 3
"""Docker does not answer; `baton`'s own status for a service that does not (a test holds the
two equal)."""
LOG_FOLDER = "env-logs"
"""Where, under the repository cache, a failed build's whole log is written."""


def _environments(settings: WorkerSettings) -> Environments:
    client = connect(settings.redis_section())
    return Environments(
        client,
        RepoCache(settings.repo_cache_dir),
        settings.build_settings(),
        sandbox_config=settings.sandbox_config(),
    )


def _stamped(started: float) -> Any:
    """Progress lines with the seconds since `started`; a line is never read as markup (a
    command's `.[test]` would be taken for a tag and vanish)."""

    def say(line: str) -> None:
        err.print(f"[dim]{time.monotonic() - started:6.1f}s[/] {escape(line)}", highlight=False)

    return say


@click.group()
def env() -> None:
    """The repositories' environments: built once per repository and dependency set, shared by
    the fleet."""


@env.command()
@click.argument("repo")
@click.option("--ref", default="HEAD", show_default=True, help="Branch, tag or commit.")
@click.option("--env", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An environment spec to use instead of the repository's.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def build(repo: str, ref: str, spec_file: Path | None, as_json: bool) -> None:
    """Build (unless built) and validate REPO's environment at REF."""
    settings = WorkerSettings()
    commit = resolve_commit(repo, ref)
    started = time.monotonic()
    with _reported(settings, repo, commit):
        spec = load(spec_file) if spec_file else None
        found = _environments(settings).prepare(
            repo_source(repo), commit, spec=spec, progress=_stamped(started)
        )
    figures = {
        "key": found.key, "image": found.tag, "built": found.built, "commit": commit,
        "test_command": found.test_command, "passed": len(found.baseline.passed),
        "failed": len(found.baseline.failed), "seconds": round(time.monotonic() - started, 2),
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    verb = "built" if found.built else "already built"
    out.print(
        f"{found.tag} {verb} in {figures['seconds']:.1f}s: {figures['passed']} tests pass and "
        f"{figures['failed']} fail on {commit[:12]} ({found.test_command or 'no test command'})"
    )


@env.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def list_environments(as_json: bool) -> None:
    """The environments the fleet has built (and those that failed recently)."""
    environments = _environments(WorkerSettings())
    records = [r for r in (environments.record(k) for k in environments.keys()) if r]
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    now = time.time()
    title = f"{len(records)} environment{'' if len(records) == 1 else 's'}"
    table = Table(title=title, title_justify="left")
    for column in ("key", "status", "repository", "size", "age", "used", "pass", "fail"):
        table.add_column(column, no_wrap=column == "key", overflow="fold")
    for r in sorted(records, key=lambda r: -float(r.get("last_used") or r.get("built_at") or 0)):
        table.add_row(
            r["key"], r.get("status", "?"), r.get("repo", ""),
            f"{int(r.get('size_bytes') or 0) / 1e6:.0f} MB" if r.get("size_bytes") else "",
            _ago(now, r.get("built_at")), _ago(now, r.get("last_used")),
            r.get("passed", ""), r.get("failed", ""),
        )  # fmt: skip
    out.print(table)


@env.command()
@click.option("--older-than", "days", default=14.0, show_default=True,
              help="Remove environments not used for this many days.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Only say what would go.")
def prune(days: float, dry_run: bool) -> None:
    """Remove environment images (and their records) not used for a while."""
    settings = WorkerSettings()
    environments = _environments(settings)
    with _reported(settings):
        removed = environments.prune(older_than_s=days * 86_400, dry_run=dry_run)
    for key in removed:
        click.echo(("would remove " if dry_run else "removed ") + key)
    err.print(f"{len(removed)} environments {'to remove' if dry_run else 'removed'}")


@env.command()
@click.argument("repo")
@click.option("--ref", default="HEAD", show_default=True, help="Branch, tag or commit.")
def shell(repo: str, ref: str) -> None:
    """A shell in REPO's agent-phase sandbox: a stage's own, started the same way from its
    environment image (no network, no capabilities, read-only root, its limits and variables),
    with the tree at REF in the workspace. Its exit status is the shell's."""
    settings = WorkerSettings()
    commit = resolve_commit(repo, ref)
    environments = _environments(settings)
    with _reported(settings, repo, commit):
        found = environments.prepare(repo_source(repo), commit, progress=_stamped(time.monotonic()))
        config = agent_config(settings.sandbox_config(), found.tag, found.spec)
        uid, gid = config.uid_gid
        tree = environments.mirrors.archive(repo_source(repo), commit, uid=uid, gid=gid)
        shown = {"baton.shell": repo_key(repo_source(repo))}
        with sandbox.DockerSandbox.start(config, labels=shown, env=dict(found.spec.env)) as box:
            box.put_archive(config.workspace, tree)
            err.print(f"{found.tag}, {commit[:12]} in {config.workspace}; exit to leave")
            interactive = ["-it"] if sys.stdin.isatty() else ["-i"]
            docker_cli = {
                k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("DOCKER_")
            }
            status = subprocess.call(  # the docker CLI for the terminal; nothing of ours goes in
                ["docker", "exec", *interactive, "-w", config.workspace, box.id, "sh"],
                env=docker_cli,
            )
    sys.exit(status)


@env.command(name="detect")
@click.argument("repo")
@click.option("--ref", default="HEAD", show_default=True, help="Branch, tag or commit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def detect_spec(repo: str, ref: str, as_json: bool) -> None:
    """The environment spec REPO at REF would get, as TOML with a comment per choice saying
    why: save it as .baton/environment.toml and edit it. Reads the tree only: nothing is built
    and no service is needed."""
    settings = WorkerSettings()
    commit = resolve_commit(repo, ref)
    with _reported(settings, repo, commit):
        mirrors = RepoCache(settings.repo_cache_dir)
        tree = mirrors.archive(repo_source(repo), commit, uid=os.getuid(), gid=os.getgid())
        version = mirrors.version(repo_source(repo), commit)
        with tempfile.TemporaryDirectory(prefix="baton-detect-") as folder:
            root = Path(folder)
            unpack_files(tree, root)
            reasons: tuple[str, ...]
            if (root / SPEC_FILE).is_file():
                spec, reasons = load(root / SPEC_FILE, root=root), (f"read from {SPEC_FILE}",)
            else:
                found = detection(root, version=version)
                spec, reasons = found.spec, found.reasons
    if as_json:
        shown = {"commit": commit, "spec": spec.model_dump(mode="json"), "reasons": reasons}
        click.echo(json.dumps(shown, indent=2))
        return
    head = f"baton env detect {repo} --ref {ref}: {commit[:12]}, spec {spec.source}"
    click.echo(to_toml(spec, [head, *reasons]), nl=False)


@contextmanager
def _reported(settings: WorkerSettings, repo: str = "", commit: str = "") -> Iterator[None]:
    """Ends the command on a sandbox failure as the module docstring says: its message, the
    tail, the log's location (named for `repo` and `commit`), and the exit status."""
    try:
        yield
    except (EnvironmentBuildError, EnvironmentValidationError) as exc:
        name = f"{repo_key(repo_source(repo))}-{commit[:12]}.log" if repo else "env.log"
        path = _write_log(settings.repo_cache_dir / LOG_FOLDER / name, exc)
        said, _, tail = str(exc).partition("\n")
        _say(said, tail=tail, more=f"the whole log: {path}")
        sys.exit(EXIT_FAILED)
    except EnvironmentSpecError as exc:
        _say(str(exc))
        sys.exit(EXIT_BAD_INPUT)
    except (SandboxUnavailableError, docker.errors.DockerException) as exc:
        _say(f"Docker does not answer ({exc}); start it, or point DOCKER_HOST at it")
        sys.exit(EXIT_UNREACHABLE)
    except SandboxStartError as exc:
        _say(str(exc))
        sys.exit(EXIT_FAILED)


def _write_log(path: Path, exc: Exception) -> Path:
    """The failure's whole log (the message, when another worker's build failed) at `path`."""
    log = getattr(exc, "log", "") or str(exc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(log, encoding="utf-8")
    return path


def _say(line: str, *, tail: str = "", more: str = "") -> None:
    """One line on stderr, then the tail and `more` as they are (never read as markup)."""
    err.print(f"[red]error:[/] {escape(line.rstrip(':'))}", highlight=False, soft_wrap=True)
    for text in (tail, more):
        if text.strip():
            err.print(escape(re.sub(r"\n{3,}", "\n\n", text.rstrip())), highlight=False,
                      soft_wrap=True)  # fmt: skip


def _ago(now: float, stamp: str | None) -> str:
    if not stamp:
        return ""
    seconds = now - float(stamp)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
