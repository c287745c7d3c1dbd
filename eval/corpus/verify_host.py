#!/usr/bin/env python3
"""Check on this host, without Docker, that each instance of the evaluation corpus is sound.

Run it from the repository root with Baton's virtualenv: it reads the instances with Baton's
own loader (`evaluation.corpus`), checks `[environment]` with `sandbox.environment`, and reads
test output with the parser the harness uses (`workers.outcomes`).

    .venv/bin/python eval/corpus/verify_host.py                  # every instance
    .venv/bin/python eval/corpus/verify_host.py ID [ID ...]      # some of them
    .venv/bin/python eval/corpus/verify_host.py --reuse-venvs    # keep the virtualenvs

For each instance it:

 0. for a git instance, unpacks base.tar.gz into $TMPDIR/baton-corpus-verify/ID and commits it
    (the *base*; there is no published commit to compare with in step 3). For a PyPI one,
    downloads the sdist into build/corpus-work/downloads (`pip download --no-binary NAME
    --no-deps`: `--no-binary :all:` would also build every build backend from source while pip
    reads the sdist's metadata, which takes minutes; the file is the same), unpacks it into a
    fresh git repository, $TMPDIR/baton-corpus-verify/ID, commits it (the *published* commit),
    applies break.patch and commits again (the *base*). The repository is not under this one:
    pytest takes its configuration from the nearest folder above that has some, and for a
    project that has none of its own that would be Baton's pyproject.toml (a run whose pytest
    reports another rootdir than the repository is a problem);
 1. makes build/corpus-work/venvs/ID with `/usr/bin/python3 -m venv` and runs the instance's
    `[environment].setup` commands at the repository's root, the venv's bin first on PATH (the
    spec's Debian `packages` are not installed here: an instance that compiles C needs this
    host to have a C compiler and Python's headers, `apt-get install build-essential
    python3-dev`);
 2. applies test.patch (and runs the spec's `build` commands if it changed a file that
    `build_inputs` names, as a sandbox does before a command); then each FAIL_TO_PASS test, run
    alone (the test command with the ids appended, so a pytest command names no test path of its
    own; for unittest, `-k ID` each), must fail, and in a run of the whole suite every
    FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass;
 3. applies gold.patch (and runs `build` likewise: a fix to compiled code is compiled before
    the runs); base + test.patch + gold.patch must be the published source up to
    whitespace (so break.patch reversed is the change); the FAIL_TO_PASS tests run alone must
    pass and their command exit 0 (as a pipeline's proof runs them); in two runs of the whole
    suite every FAIL_TO_PASS and every PASS_TO_PASS test must pass, and PASS_TO_PASS must list
    every test that passed in all three runs (a test that passes in one run and not in another
    is flaky and must not be listed);
 4. gold.patch may touch no test file, and test.patch only test files.

A run of the whole suite is the instance's `test` command as the harness runs it: with `-rA`
added for pytest or `-v` for unittest (`workers.outcomes.with_ids`), and
PYTEST_ADDOPTS="-p no:cacheprovider". What a run
printed is kept in build/corpus-work/verify/ID/*.log, and what the runs showed is written to
build/corpus-work/verify/ID/suggested.toml as `[tests]` lists ready to paste into
instance.toml. It prints a table and exits 1 when any instance has a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from evaluation.corpus import (  # noqa: E402
    BASE_ARCHIVE,
    CorpusError,
    GitSource,
    Instance,
    load_corpus,
    unpack_base,
)
from sandbox.environment import from_table  # noqa: E402
from sandbox.errors import EnvironmentSpecError  # noqa: E402
from workers.outcomes import Outcome, parse, with_ids  # noqa: E402

CORPUS = REPO / "eval" / "corpus"
WORK = REPO / "build" / "corpus-work"
"""Downloads, virtualenvs, and each instance's logs (verify/ID)."""
CHECKOUTS = Path(tempfile.gettempdir()) / "baton-corpus-verify"
"""The instances' repositories: outside this repository (see step 0)."""
BASE_PYTHON = "/usr/bin/python3"
"""The interpreter of the instances' virtualenvs: Python 3.11, as in Baton's sandboxes."""
TEST_ENV = {"PYTEST_ADDOPTS": "-p no:cacheprovider"}
"""As the harness runs tests (`workers.tools.code.TEST_ENV`)."""
GIT_CONFIG = {
    "safe.directory": "*",  # the sdist's files may belong to another user
    "user.name": "corpus",
    "user.email": "corpus@localhost",
    "commit.gpgsign": "false",
    "core.autocrlf": "false",
}
GIT = ["git", *(arg for item in GIT_CONFIG.items() for arg in ("-c", "=".join(item)))]
SETUP_TIMEOUT_S = 1200.0
SUITE_TIMEOUT_S = 900.0
GOLD_RUNS = 2
"""Runs of the whole suite with the fix: a test must pass in each to count."""
TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*$|_tests?\.py$|(^|/)conftest\.py$")
"""A path that holds tests: in a `test`, `tests` or `testing` folder, or a test module."""
ISSUE_KEYS = ("number", "title", "body", "html_url", "state", "user", "labels")


class Problem(Exception):
    """A step failed in a way that stops the instance's checks; the message says how."""


@dataclass
class Report:
    """One instance's verdict."""

    id: str
    f2p: int = 0
    p2p: int = 0
    suite_s: float | None = None
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """One run of tests: each test id's outcome, and how long it took."""

    outcomes: dict[str, Outcome]
    seconds: float
    exit_code: int

    def passed(self) -> set[str]:
        return {i for i, o in self.outcomes.items() if o == Outcome.PASSED}

    def failed(self) -> set[str]:
        return {i for i, o in self.outcomes.items() if o == Outcome.FAILED}


def is_test_path(path: str) -> bool:
    return TEST_PATH.search(path) is not None


def run(argv: list[str], cwd: Path, *, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    """`argv`'s result, its output and errors together; raises Problem when it fails."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        timeout=timeout,
        text=True,
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if done.returncode != 0:
        raise Problem(f"`{shlex.join(argv)}` exited {done.returncode}: {done.stdout[-2000:]}")
    return done


def sdist(instance: Instance) -> Path:
    """The instance's sdist in WORK/downloads, downloaded unless it is there already."""
    downloads = WORK / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    name, version = instance.source.pypi, instance.source.version
    wanted = re.sub(r"[-_.]+", "-", f"{name}-{version}".lower())

    def found() -> Path | None:
        for path in sorted(downloads.iterdir()):
            stem = path.name.removesuffix(".tar.gz").removesuffix(".zip")
            if stem != path.name and re.sub(r"[-_.]+", "-", stem.lower()) == wanted:
                return path
        return None

    if (archive := found()) is None:
        argv = ["download", "--quiet", "--no-binary", name, "--no-deps", "--dest", str(downloads)]
        run([sys.executable, "-m", "pip", *argv, f"{name}=={version}"], WORK)
        if (archive := found()) is None:
            raise Problem(f"pip downloaded no sdist of {name}=={version}")
    return archive


def unpack(archive: Path, dest: Path) -> None:
    """The archive's single top folder's contents, copied to `dest` (owned by this user)."""
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(tmp)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        shutil.copytree(top, dest, symlinks=True)


def commit(repo: Path, message: str) -> str:
    run([*GIT, "add", "--all", "--force"], repo)
    run([*GIT, "commit", "--quiet", "--no-verify", "--allow-empty", "-m", message], repo)
    return run([*GIT, "rev-parse", "HEAD"], repo).stdout.strip()


def apply(repo: Path, patch: Path) -> None:
    """Applies `patch`, staging what it changes (so new files are compared too)."""
    try:
        run([*GIT, "apply", "--index", "--whitespace=nowarn", str(patch)], repo)
    except Problem as exc:
        raise Problem(f"{patch.name} does not apply: {exc}") from None


def environ(venv: Path, instance: Instance) -> dict[str, str]:
    """This process's environment with the venv first on PATH and the instance's variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONHOME", "PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV"}
    }
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    sandbox_only = {"PATH", "VIRTUAL_ENV"}  # the sandbox's virtualenv; here it is `venv`
    given = instance.environment.get("env", {}).items()
    env.update({k: str(v) for k, v in given if k not in sandbox_only})
    return env


SANDBOX_VENV = "python3 -m venv /opt/baton/venv"
"""An instance's first setup step: the sandbox's virtualenv, which its `env` puts first on
PATH (a spec's setup runs as written; Baton adds nothing to it)."""


def set_up(instance: Instance, repo: Path, venv: Path, *, reuse: bool, log: Path) -> None:
    if not (reuse and (venv / "bin" / "python").exists()):
        shutil.rmtree(venv, ignore_errors=True)
        run([BASE_PYTHON, "-m", "venv", str(venv)], WORK)
    setup = [c for c in instance.environment.get("setup", []) if c != SANDBOX_VENV]
    commands("setup", setup, instance, repo, venv, log)  # the venv is made above, on this host


def commands(
    what: str, argvs: list[str], instance: Instance, repo: Path, venv: Path, log: Path
) -> None:
    """Runs shell commands in order at the repository's root, their output in `log`."""
    env = environ(venv, instance)
    with log.open("w") as out:
        for command in argvs:
            out.write(f"$ {command}\n")
            out.flush()
            done = subprocess.run(
                ["sh", "-c", command],
                cwd=repo,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=SETUP_TIMEOUT_S,
            )
            if done.returncode != 0:
                raise Problem(f"{what} `{command}` exited {done.returncode} (see {log})")


def rebuild(instance: Instance, repo: Path, venv: Path, patch: str, log: Path) -> bool:
    """The spec's build step, as a sandbox runs it before a command, after `patch` was applied:
    run when the patch changed a file the spec's `build_inputs` name (git pathspecs, matched
    by git; none: every file). Returns whether it ran."""
    build = instance.environment.get("build", [])
    pathspecs = instance.environment.get("build_inputs", [])
    listed = run([*GIT, "ls-files", "-z", "--", *pathspecs], repo).stdout.split("\0")
    if not build or not set(instance.files(patch)) & set(listed):
        return False
    commands("build", build, instance, repo, venv, log)
    return True


def tests(instance: Instance, repo: Path, venv: Path, log: Path, ids: tuple[str, ...] = ()) -> Run:
    """One run of the instance's test command as the harness makes it, with `ids` appended.

    Raises:
        Problem: pytest ran elsewhere than at the repository's root, or a run of the whole
            suite named no test (a run of some ids that names none is a Run without outcomes).
    """
    if instance.tests.runner == "unittest":  # `-k` patterns match the dotted ids
        ids = tuple(arg for i in ids for arg in ("-k", i))
    command = with_ids(instance.environment["test"]) + "".join(f" {shlex.quote(i)}" for i in ids)
    started = time.monotonic()
    done = subprocess.run(
        ["sh", "-c", command],
        cwd=repo,
        env={**environ(venv, instance), **TEST_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SUITE_TIMEOUT_S,
    )
    seconds = time.monotonic() - started
    log.write_text(f"$ {command}\n{done.stdout}\n[exit code {done.returncode}]\n")
    rootdir = re.search(r"^rootdir: (.*)$", done.stdout, re.MULTILINE)
    if rootdir and Path(rootdir.group(1).strip()) != repo:
        raise Problem(f"pytest's rootdir is {rootdir.group(1)}, not the repository (see {log})")
    outcomes = parse(done.stdout)
    if outcomes.runner is None and not ids:
        raise Problem(f"the test command named no test (see {log})")
    return Run(outcomes.by_id, seconds, done.returncode)


def expect(report: Report, run: Run, ids: tuple[str, ...], wanted: Outcome, when: str) -> None:
    """A problem for each id whose outcome is not `wanted` (at most a few named)."""
    wrong = [i for i in ids if run.outcomes.get(i) != wanted]
    if wrong:
        shown = ", ".join(f"{i} ({run.outcomes.get(i, 'not run')})" for i in wrong[:3])
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        report.problems.append(f"{when}: {len(wrong)} not {wanted}: {shown}{more}")


def static_checks(instance: Instance, report: Report) -> None:
    """Step 4, and what the files must hold before anything runs."""
    try:
        from_table(instance.environment, origin=f"{instance.id}/instance.toml [environment]")
    except EnvironmentSpecError as exc:
        report.problems.append(str(exc))
    if not instance.environment.get("test"):
        report.problems.append("[environment] has no test command")
    if missing := [k for k in ISSUE_KEYS if k not in instance.issue]:
        report.problems.append(f"issue.json lacks {', '.join(missing)}")
    gold, test = instance.files("gold.patch"), instance.files("test.patch")
    if not gold or not test:
        report.problems.append("gold.patch and test.patch must each change a file")
    if tested := [p for p in gold if is_test_path(p)]:
        report.problems.append(f"gold.patch touches test files: {', '.join(tested)}")
    if untested := [p for p in test if not is_test_path(p)]:
        report.problems.append(f"test.patch touches non-test files: {', '.join(untested)}")
    if overlap := set(instance.tests.fail_to_pass) & set(instance.tests.pass_to_pass):
        report.problems.append(f"in both fail_to_pass and pass_to_pass: {sorted(overlap)[:3]}")
    if list(instance.tests.pass_to_pass) != sorted(set(instance.tests.pass_to_pass)):
        report.problems.append("pass_to_pass is not sorted, or repeats an id")


def checkout(instance: Instance, repo: Path) -> str | None:
    """Step 0: the base at `repo`; returns the commit of the published source (None for a git
    instance, whose base is `base.tar.gz`: there the published source is the upstream fix
    commit, which the instance folder does not hold)."""
    if isinstance(instance.source, GitSource):
        unpack_base(instance.folder / BASE_ARCHIVE, repo)
        run([*GIT, "init", "--quiet", "--initial-branch=main"], repo)
        commit(repo, f"{instance.id}: the base ({instance.source})")
        return None
    unpack(sdist(instance), repo)
    run([*GIT, "init", "--quiet", "--initial-branch=main"], repo)
    published = commit(repo, f"{instance.source.pypi} {instance.source.version} as published")
    apply(repo, instance.folder / "break.patch")
    commit(repo, f"{instance.id}: the base (the fix reverted)")
    return published


def unlike_published(repo: Path, published: str) -> list[str]:
    """The staged files that differ from the published commit beyond whitespace."""
    argv = ["diff", "--cached", "--ignore-all-space", "--ignore-blank-lines", "--name-only"]
    return run([*GIT, *argv, published], repo).stdout.split()


def suggest(path: Path, runner: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> None:
    """Writes the `[tests]` table the runs showed, for instance.toml."""
    lines = ["[tests]", f'runner = "{runner}"', "fail_to_pass = ["]
    lines += [f"    {json.dumps(i)}," for i in fail_to_pass] + ["]", "pass_to_pass = ["]
    lines += [f"    {json.dumps(i)}," for i in pass_to_pass] + ["]", ""]
    path.write_text("\n".join(lines))


def verify(instance: Instance, *, reuse_venv: bool) -> Report:
    f2p, p2p = instance.tests.fail_to_pass, instance.tests.pass_to_pass
    report = Report(instance.id, len(f2p), len(p2p))
    static_checks(instance, report)
    place, repo = WORK / "verify" / instance.id, CHECKOUTS / instance.id
    venv = WORK / "venvs" / instance.id
    for folder in (place, repo):
        shutil.rmtree(folder, ignore_errors=True)
    place.mkdir(parents=True)
    repo.parent.mkdir(parents=True, exist_ok=True)
    try:
        published = checkout(instance, repo)
        set_up(instance, repo, venv, reuse=reuse_venv, log=place / "setup.log")

        apply(repo, instance.folder / "test.patch")
        rebuild(instance, repo, venv, "test.patch", place / "build-test.log")
        alone = tests(instance, repo, venv, place / "1-fail-to-pass-alone.log", f2p)
        expect(report, alone, f2p, Outcome.FAILED, "base+test, run alone")
        base = tests(instance, repo, venv, place / "2-base-with-tests.log")
        expect(report, base, f2p, Outcome.FAILED, "base+test")
        expect(report, base, p2p, Outcome.PASSED, "base+test")

        apply(repo, instance.folder / "gold.patch")
        rebuild(instance, repo, venv, "gold.patch", place / "build-gold.log")
        if published is not None and (differ := unlike_published(repo, published)):
            shown = ", ".join(differ[:5])
            report.problems.append(f"base+test+gold is not the published source: {shown}")
        alone = tests(instance, repo, venv, place / "3-fail-to-pass-alone-fixed.log", f2p)
        expect(report, alone, f2p, Outcome.PASSED, "base+test+gold, run alone")
        if alone.exit_code != 0:  # a pipeline's proof runs them so, and needs the exit code 0
            report.problems.append(
                f"base+test+gold: the FAIL_TO_PASS tests alone pass but the command exits "
                f"{alone.exit_code} (see {place / '3-fail-to-pass-alone-fixed.log'})"
            )
        golds = [
            tests(instance, repo, venv, place / f"3-gold-{n}.log") for n in range(1, GOLD_RUNS + 1)
        ]
        report.suite_s = golds[0].seconds
        for number, gold in enumerate(golds, 1):
            expect(report, gold, f2p, Outcome.PASSED, f"base+test+gold, run {number}")
            expect(report, gold, p2p, Outcome.PASSED, f"base+test+gold, run {number}")

        always = base.passed().intersection(*(g.passed() for g in golds)) - set(f2p)
        fixed = base.failed().intersection(*(g.passed() for g in golds))
        suggest(place / "suggested.toml", instance.tests.runner, sorted(fixed), sorted(always))
        if unlisted := sorted(always - set(p2p)):
            report.problems.append(
                f"pass_to_pass lacks {len(unlisted)} tests that passed in every run, e.g. "
                f"{unlisted[0]} (see {place / 'suggested.toml'})"
            )
    except (Problem, CorpusError, subprocess.TimeoutExpired, OSError) as exc:
        report.problems.append(str(exc))
    return report


def table(reports: list[Report]) -> str:
    rows = [("instance", "F2P", "P2P", "suite s", "result")]
    for r in reports:
        seconds = "-" if r.suite_s is None else f"{r.suite_s:.1f}"
        rows.append((r.id, str(r.f2p), str(r.p2p), seconds, "problem" if r.problems else "ok"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if c == 0 else cell.rjust(w) if c < 4 else cell
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="instances to check (default: all)")
    parser.add_argument(
        "--reuse-venvs",
        action="store_true",
        help="keep an instance's virtualenv if it exists (setup still runs)",
    )
    args = parser.parse_args(argv)
    try:
        instances = load_corpus(CORPUS, tuple(args.ids))
    except CorpusError as exc:
        print(exc, file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    reports = []
    for instance in instances:
        print(f"checking {instance.id} ...", flush=True)
        report = verify(instance, reuse_venv=args.reuse_venvs)
        for problem in report.problems:
            print(f"  problem: {problem}", flush=True)
        reports.append(report)
    print()
    print(table(reports))
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
