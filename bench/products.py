"""Build products kept (issue 25): what opening a sandbox over an environment's build products
costs against the plain copy-in it replaced, and what the build step costs in the sandbox.

A real C extension, MarkupSafe 2.1.5 (`testkit.native`): its environment is built once, at the
published commit, keeping the compiled `_speedups` module in the image's workspace. Then,
interleaved in `ROUNDS` rounds (the order rotating by round), on each sandbox host — gVisor's
`runsc`, as the workers run, and runc — `DockerSandboxes.open` at that commit:

  (1) overlay: the environment as it is recorded now, with its commit and products: the tree
      dated against the image's commit, laid over the products, git told to ignore them, the
      baseline committed;
  (2) copy-in: the same open with the environment as it was recorded before products were kept
      (no commit, no products, no build step): the tree copied in and committed, as every
      sandbox was made before. The image is the same, so its workspace holds the products here
      too, and the baseline commits them with the tree (a few small files).

Each is timed from asking for the workspace to holding it, baseline committed; then the first
test command (the spec's `test`; in (1) the build step's check runs before it and finds the
tree unchanged), then the sandbox is removed (not timed).

Then the build step alone (`Rebuild.ensure`) under runsc, `BUILD_ROUNDS` times each, each in a
fresh sandbox opened with the build overlay:

  (3) unchanged: the run's commit is the image's; all the step does is check the build inputs
      (target: it builds nothing);
  (4) one line of C: the run's commit changes one line of `_speedups.c`: the check, the
      rebuild (`python setup.py build_ext --inplace`), the new products hidden from git, the
      check again. That the module was rebuilt is proven afterwards: it escapes `>` the new way.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import docker

from bench import record
from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED
from bench.sandbox import stats
from sandbox import IMAGE_TAG, SandboxConfig, ensure_image
from sandbox.build import build_environment, environment_tag
from testkit.native import PROJECT, RIGHT, SPEC, WRONG, commit_speedups, git
from testkit.projects import as_git_repo, python_sdist
from workers.environments import Environment
from workers.mirrors import RepoCache
from workers.outcomes import Outcomes
from workers.rebuild import BuildRun
from workers.sandboxes import DockerSandboxes, WorkspaceRequest
from workers.tools.container import ContainerWorkspace

CODE: tuple[str, ...] = (
    "bench/products.py",
    "bench/sandbox.py",
    "orchestrator/",
    "workers/",
    "sandbox/",
    "images/",
    "testkit/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

ROUNDS = 12
WARMUP = 2
BUILD_ROUNDS = 6
RUNTIMES: dict[str, str | None] = {"runsc": "runsc", "runc": None}
VARIANTS = ("overlay", "copy-in")
TREES = ("unchanged", "one line of C")
KEY = "benchproducts"
LABELS = {"baton.bench": "products"}
DOWNLOADS = record.ROOT / "build" / "test-projects"
TEST_TIMEOUT_S = 300.0
PROBE = ["python", "-c", "from markupsafe import _speedups; print(_speedups.escape('>'))"]
"""Prints how the compiled module escapes `>`: `&gr;` once the changed line is compiled."""


@dataclasses.dataclass(frozen=True)
class Project:
    """The repository, its two commits and the environment built at the first."""

    repo: str
    published: str
    changed: str
    """One line of `_speedups.c` changed from `published`."""
    env: Environment
    build_s: float

    def request(self, commit: str, variant: str = "overlay") -> WorkspaceRequest:
        env = self.env
        if variant == "copy-in":  # as an environment was recorded before products were kept
            spec = env.spec.model_copy(update={"build": (), "build_inputs": ()})
            env = dataclasses.replace(env, spec=spec, commit=None, products=())
        return WorkspaceRequest(
            repo=self.repo, commit=commit, stage="bench", labels=LABELS, environment=env
        )


def prepare(client: docker.DockerClient, folder: Path, say: Callable[[str], None]) -> Project:
    """MarkupSafe as a repository with its two commits, and its environment built."""
    repo = as_git_repo(python_sdist(*PROJECT, DOWNLOADS), folder / "repo")
    published = git(repo, "rev-parse", "HEAD")
    changed = commit_speedups(repo, RIGHT, WRONG, "speedups: one line changed")
    uid, gid = SandboxConfig().uid_gid
    tree = RepoCache(folder / "tree").archive(str(repo), published, uid=uid, gid=gid)
    tag = environment_tag(KEY)
    made = build_environment(SPEC, tree, tag=tag, labels=LABELS, client=client, progress=say)
    env = Environment(
        key=KEY, tag=tag, spec=SPEC, test_command=SPEC.test, baseline=Outcomes(),
        commit=published, products=made.products,
    )  # fmt: skip
    return Project(str(repo), published, changed, env, made.build_s)


def open_and_test(sandboxes: DockerSandboxes, request: WorkspaceRequest) -> tuple[float, float]:
    """Seconds from asking for the workspace to holding it, and of its first test command
    (which must build nothing: the tree is the image's own)."""
    builds: list[BuildRun] = []
    request = dataclasses.replace(request, on_build=builds.append)
    started = time.perf_counter()
    with sandboxes.open(request) as workspace:
        held = time.perf_counter()
        result = workspace.run(["sh", "-c", SPEC.test or ""], timeout_s=TEST_TIMEOUT_S)
        tested = time.perf_counter()
    if builds:
        raise RuntimeError(f"the first command ran the build step on the image's own tree:\n"
                           f"{builds[0].log[-2000:]}")  # fmt: skip
    if result.exit_code != 0:
        raise RuntimeError(f"the test command failed in the sandbox:\n{result.output[-2000:]}")
    return held - started, tested - held


def build_step(
    sandboxes: DockerSandboxes, request: WorkspaceRequest, escapes: str
) -> tuple[float, BuildRun | None]:
    """Seconds the build step takes before a first command, and its build (None: skipped);
    raises unless the compiled module then escapes `>` as `escapes`."""
    with sandboxes.open(request) as workspace:
        if not isinstance(workspace, ContainerWorkspace) or workspace.rebuild is None:
            raise RuntimeError("the workspace has no build step: the spec's `build` is lost")
        # Taken off the workspace, so that the step's own commands (`run`) do not run it again.
        rebuild, workspace.rebuild = workspace.rebuild, None
        started = time.perf_counter()
        ran = rebuild.ensure(
            lambda argv, limit_s: workspace.run(argv, timeout_s=limit_s), workspace.exclude
        )
        took_s = time.perf_counter() - started
        escaped = workspace.run(PROBE, timeout_s=TEST_TIMEOUT_S).output.strip()
    if escaped != escapes:
        raise RuntimeError(f"the compiled module escapes > as {escaped!r}, not {escapes!r}")
    return took_s, ran


def rotated(names: list[Any], rotation: int) -> list[Any]:
    """`names` starting from the `rotation`-th, wrapping round."""
    first = rotation % len(names)
    return names[first:] + names[:first]


def run(progress: Any) -> dict[str, Any]:
    jobs = [(host, variant) for host in RUNTIMES for variant in VARIANTS]
    total = len(jobs) * (WARMUP + ROUNDS) + len(TREES) * BUILD_ROUNDS
    task = progress.add_task("products: building MarkupSafe's environment", total=total)
    client = docker.from_env()
    with ExitStack() as stack:
        stack.callback(client.close)
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-products-")))
        ensure_image(client=client)
        project = prepare(client, folder, lambda line: progress.update(task, description=line))
        stack.callback(client.images.remove, project.env.tag, force=True)
        mirrors = RepoCache(folder / "mirrors")
        sandboxes = {
            host: DockerSandboxes(mirrors, SandboxConfig(image=IMAGE_TAG, runtime=runtime))
            for host, runtime in RUNTIMES.items()
        }
        progress.update(task, description="products: open + first test, overlay vs copy-in")
        opened: dict[tuple[str, str], list[tuple[float, float]]] = {job: [] for job in jobs}
        for number in range(WARMUP + ROUNDS):
            for host, variant in rotated(jobs, number):
                request = project.request(project.published, variant)
                timed = open_and_test(sandboxes[host], request)
                if number >= WARMUP:
                    opened[host, variant].append(timed)
                progress.advance(task)
        progress.update(task, description="products: the build step (runsc)")
        steps: dict[str, list[tuple[float, BuildRun | None]]] = {tree: [] for tree in TREES}
        trees = {
            "unchanged": (project.published, "&gt;"),
            "one line of C": (project.changed, "&gr;"),
        }
        for number in range(BUILD_ROUNDS):
            for tree in rotated(list(TREES), number):
                commit, escapes = trees[tree]
                steps[tree].append(build_step(sandboxes["runsc"], project.request(commit), escapes))
                progress.advance(task)
    return summarize(project, opened, steps)


def summarize(
    project: Project,
    opened: dict[tuple[str, str], list[tuple[float, float]]],
    steps: dict[str, list[tuple[float, BuildRun | None]]],
) -> dict[str, Any]:
    """The figures of a run: per host and variant, the open and the first test command; the
    build step per tree; the overlay's open against the copy-in's, per host."""
    hosts: dict[str, Any] = {}
    for (host, variant), times in opened.items():
        hosts.setdefault(host, {})[variant] = {
            "open": stats([o for o, _ in times]),
            "first_test": stats([t for _, t in times]),
        }
    ratios = {
        host: {q: round(fig["overlay"]["open"][f"{q}_ms"] / fig["copy-in"]["open"][f"{q}_ms"], 2)
               for q in ("p50", "p95")}
        for host, fig in hosts.items()
    }  # fmt: skip
    unchanged, changed = steps["unchanged"], steps["one line of C"]
    unchanged_builds = sum(ran is not None for _, ran in unchanged)
    compiles = [ran.duration_s for _, ran in changed if ran is not None]
    return {
        "project": " ".join(PROJECT),
        "products": len(project.env.products),
        "environment_build_s": project.build_s,
        "rounds": len(next(iter(opened.values()))),
        "hosts": hosts,
        "overlay_over_copy_in": ratios,
        "build_step": {
            "host": "runsc",
            "unchanged": {**stats([s for s, _ in unchanged]), "builds": unchanged_builds},
            "one line of C": {
                **stats([s for s, _ in changed]),
                "builds": len(compiles),
                "compile": stats(compiles),
            },
        },
        "targets": {
            "builds on an unchanged tree": {
                "target": "0",
                "value": unchanged_builds,
                "met": unchanged_builds == 0,
            },
        },
    }


NAMES = {"overlay": "build overlay", "copy-in": "copy-in (before)"}
HEADER = ["host", "sandbox", "runs", "open p50 (ms)", "open p95 (ms)",
          "first test command p50 (ms)", "p95 (ms)"]  # fmt: skip


def latest(source: Source) -> str:
    """The latest run: each host's two opens and their first test command, the build step."""
    rows = [
        [f"**{host}**", NAMES[variant], str(fig["open"]["n"]), _ms(fig["open"]["p50_ms"]),
         _ms(fig["open"]["p95_ms"]), _ms(fig["first_test"]["p50_ms"]),
         _ms(fig["first_test"]["p95_ms"])]
        for host, variants in source["hosts"].items()
        for variant, fig in variants.items()
    ]  # fmt: skip
    ratios = "; ".join(
        f"{r['p50']:.2f}× at p50 and {r['p95']:.2f}× at p95 under {host}"
        for host, r in source["overlay_over_copy_in"].items()
    )
    step = source["build_step"]
    once, changed = step["unchanged"], step["one line of C"]
    steps = [
        ["unchanged (the check alone)", str(once["n"]), str(once["builds"]),
         _ms(once["p50_ms"]), _ms(once["p95_ms"])],
        ["one line of `_speedups.c` changed", str(changed["n"]), str(changed["builds"]),
         _ms(changed["p50_ms"]), _ms(changed["p95_ms"])],
        ["… of which the build command", str(changed["compile"]["n"]), "",
         _ms(changed["compile"]["p50_ms"]), _ms(changed["compile"]["p95_ms"])],
    ]  # fmt: skip
    setup = (
        f"{source['project']}, {source['products']} build products kept, "
        f"its environment built in {source['environment_build_s']:.0f} s"
    )
    return (
        f"{latest_run(source, setup)}:\n\n{table(HEADER, rows)}\n\n"
        f"Opening over the build products against the copy-in: {ratios}.\n\n"
        f"The build step before the first command, under {step['host']}, each in a fresh "
        f"sandbox:\n\n"
        f"{table(['tree', 'runs', 'builds', 'p50 (ms)', 'p95 (ms)'], steps)}\n\n"
        f"{targets_table(source['targets'])}"
    )


HISTORY = [
    "runsc overlay open p50 (ms)", "runsc copy-in open p50 (ms)", "runc overlay open p50 (ms)",
    "runc copy-in open p50 (ms)", "build step, unchanged p50 (ms)",
    "build step, one line of C p50 (ms)",
]  # fmt: skip


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    hosts, step = source["hosts"], source["build_step"]
    opens = [_ms(hosts[h][v]["open"]["p50_ms"]) for h in ("runsc", "runc") for v in VARIANTS]
    return [*opens, _ms(step["unchanged"]["p50_ms"]), _ms(step["one line of C"]["p50_ms"])]


SECTIONS = {"latest": latest}


def _ms(value: float) -> str:
    return f"{value:.0f}"
