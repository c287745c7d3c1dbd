"""Environments: what building one costs against installing the same things by hand, and how
fast a built one is found again.

A real project, python-dateutil 2.9.0.post0 from PyPI (its requirements-dev.txt: pytest,
hypothesis, freezegun, …; then the package itself, editable), alternating `ROUNDS` times:

  (1) Baton's cold build: `build_environment` from the sandbox image — a build container, the
      tree copied in, the detected setup commands, the tree and caches wiped, `docker commit`;
  (2) the strongest by-hand baseline: one `docker run --rm` of the same image with the tree
      mounted, running the very same setup commands in one shell (no copy-in, no wipe, no
      commit), with the same CA bundle and network.

Neither keeps a pip cache between rounds, so both download the same packages each time.

Then the lookups, `LOOKUPS` times each, on the environment (1) built:
  (3) a cache hit: `Environments.prepare` for a commit whose key is known (one Redis read and
      one image inspect);
  (4) a new commit of the same dependencies: the tree archived, the spec detected, the key
      hashed, the image found.

Targets: (1) at most 1.3× (2) at p50; (3) and (4) under 1 s.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import docker

from bench import record
from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED
from orchestrator.core.store import connect
from sandbox import IMAGE_TAG, ensure_image
from sandbox.build import CA_PATH, BuildSettings, build_environment, environment_tag
from sandbox.egress import PROXY_VARIABLES
from sandbox.environment import detect
from testkit import services
from testkit.projects import as_git_repo, python_sdist, tree_tar
from workers.environments import Environments
from workers.mirrors import RepoCache

CODE: tuple[str, ...] = (
    "bench/environment.py",
    "orchestrator/",
    "workers/",
    "sandbox/",
    "images/",
    "testkit/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PROJECT = ("python-dateutil", "2.9.0.post0")
ROUNDS = 3
LOOKUPS = 20
MAX_BUILD_RATIO = 1.3
MAX_LOOKUP_S = 1.0
DOWNLOADS = record.ROOT / "build" / "test-projects"


def by_hand(client: docker.DockerClient, root: Path, setup: tuple[str, ...]) -> float:
    """The setup commands in one plain `docker run` of the sandbox image, as root, the tree
    mounted, straight on Docker's default bridge (no egress proxy); its wall time in
    seconds."""
    settings = BuildSettings()
    env = {k: v for k, v in settings.command_env().items() if k not in PROXY_VARIABLES}
    script = "cp -r /src/. /workspace/ && cd /workspace && " + " && ".join(setup)
    argv = ["docker", "run", "--rm", "--user", "0:0", "--network", "bridge",
            "-v", f"{root}:/src:ro", "-e", "PIP_NO_CACHE_DIR=1",
            "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1", "-e", "HOME=/root"]  # fmt: skip
    if settings.ca_bundle is not None:
        argv += ["-v", f"{settings.ca_bundle}:{CA_PATH}:ro"]
    argv += [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
    argv += ["-e", "PATH=/opt/baton/venv/bin:/usr/local/bin:/usr/bin:/bin"]
    started = time.perf_counter()
    subprocess.run([*argv, IMAGE_TAG, "sh", "-c", script], check=True, capture_output=True)
    return time.perf_counter() - started


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("environment: cold builds and lookups", total=2 * ROUNDS + 2)
    client = docker.from_env()
    ensure_image(client=client)
    root = python_sdist(*PROJECT, DOWNLOADS)
    spec = detect(root)
    tree = tree_tar(root)
    builds: list[float] = []
    hand: list[float] = []
    tags: list[str] = []
    with ExitStack() as stack:
        for n in range(ROUNDS):
            for which in ("baton", "hand") if n % 2 == 0 else ("hand", "baton"):
                if which == "baton":
                    tag = environment_tag(f"bench-{n}")
                    tags.append(tag)
                    started = time.perf_counter()
                    build_environment(spec, tree, tag=tag, client=client)
                    builds.append(time.perf_counter() - started)
                else:
                    hand.append(by_hand(client, root, spec.setup))
                progress.advance(task)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        environments = Environments(connect(redis_url), RepoCache(work / "mirrors"),
                                    docker_client=client)  # fmt: skip
        repo = as_git_repo(root, work / "repo")
        commit = _head(repo)
        environments.prepare(str(repo), commit)  # builds once more: the lookups' environment
        progress.advance(task)
        hits, fresh = [], []
        for n in range(LOOKUPS):
            started = time.perf_counter()
            environments.prepare(str(repo), commit)
            hits.append(time.perf_counter() - started)
            (repo / "README.rst").write_text(f"changed {n}\n")
            subprocess.run(["git", "-C", str(repo), "commit", "-qam", f"readme {n}"], check=True,
                           env={"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
                                "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b",
                                "PATH": "/usr/bin:/bin"})  # fmt: skip
            started = time.perf_counter()
            found = environments.prepare(str(repo), _head(repo))
            fresh.append(time.perf_counter() - started)
            if found.built:
                raise RuntimeError("a README change rebuilt the environment")
        progress.advance(task)
        for key in environments.keys():
            tags.append((environments.record(key) or {}).get("tag", ""))
    for tag in tags:
        if tag.startswith("baton-env:"):
            try:
                client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
    client.close()
    return summarize(builds, hand, hits, fresh, spec.setup)


def _head(repo: Path) -> str:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def summarize(
    builds: list[float], hand: list[float], hits: list[float], fresh: list[float],
    setup: tuple[str, ...],
) -> dict[str, Any]:  # fmt: skip
    def stats(values: list[float]) -> dict[str, float]:
        return {"p50_s": round(statistics.median(values), 3),
                "p95_s": round(record.percentile(values, 0.95), 3), "n": len(values)}  # fmt: skip

    ratio = round(statistics.median(builds) / statistics.median(hand), 2)
    hit, new = stats(hits), stats(fresh)
    return {
        "project": "==".join(PROJECT),
        "setup": list(setup),
        "cold_build": stats(builds),
        "by_hand": stats(hand),
        "build_ratio_p50": ratio,
        "lookup_hit": hit,
        "lookup_new_commit": new,
        "targets": {
            "build_ratio_p50": {"target": f"<= {MAX_BUILD_RATIO}", "value": ratio,
                                "met": ratio <= MAX_BUILD_RATIO},
            "lookup_p95_s": {"target": f"< {MAX_LOOKUP_S}", "value": max(hit["p95_s"],
                             new["p95_s"]), "met": max(hit["p95_s"], new["p95_s"]) < MAX_LOOKUP_S},
        },
    }  # fmt: skip


HISTORY = ["project", "cold build p50 (s)", "by hand p50 (s)", "ratio p50",
           "lookup, known commit p50 (ms)", "lookup, new commit p50 (ms)"]  # fmt: skip
"""The history table's columns after the date and commit (`row`)."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    b, h = source["cold_build"], source["by_hand"]
    hit, new = source["lookup_hit"], source["lookup_new_commit"]
    return [
        source["project"],
        f"{b['p50_s']:.1f}",
        f"{h['p50_s']:.1f}",
        f"{source['build_ratio_p50']:.2f}×",
        f"{hit['p50_s'] * 1000:.0f}",
        f"{new['p50_s'] * 1000:.0f}",
    ]


def latest(source: Source) -> str:
    """The latest run: the builds, the lookups, the targets."""
    b, h = source["cold_build"], source["by_hand"]
    hit, new = source["lookup_hit"], source["lookup_new_commit"]
    rows = [
        ["(1) Baton's cold build (build container, copy-in, setup, wipe, commit)",
         str(b["n"]), f"{b['p50_s']:.1f}", f"{b['p95_s']:.1f}"],
        ["(2) the same setup in one plain `docker run`", str(h["n"]), f"{h['p50_s']:.1f}",
         f"{h['p95_s']:.1f}"],
        ["(3) lookup, known commit", str(hit["n"]), f"{hit['p50_s']:.3f}", f"{hit['p95_s']:.3f}"],
        ["(4) lookup, new commit of the same dependencies", str(new["n"]),
         f"{new['p50_s']:.3f}", f"{new['p95_s']:.3f}"],
    ]  # fmt: skip
    commands = "; ".join(f"`{command}`" for command in source["setup"])
    setup = f"{source['project']}, setup: {commands}"
    return (
        f"{latest_run(source, setup)}:\n\n"
        f"{table(['', 'n', 'p50 (s)', 'p95 (s)'], rows)}\n\n"
        f"Cold build against by hand: {source['build_ratio_p50']:.2f}× at p50.\n\n"
        + targets_table(source["targets"])
    )


SECTIONS = {"latest": latest}
