"""`api.enqueue` and `baton enqueue` with the repository a run works on: a local path must be
the root of a git repository, or nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.core.errors import EnvironmentFileError, RepoError
from orchestrator.core.settings import Settings
from tests.repos import Git, Upstream

ROOT = Path(__file__).resolve().parents[2]
ADVICE = "give the repository's root, or make it a repository with `git init`"


@pytest.fixture
def upstream(make_upstream: Callable[[], Upstream]) -> Upstream:
    """A repository whose working tree has a folder `shop/` (and a bare origin)."""
    made = make_upstream()
    made.commit({"shop/cart.py": "def total(prices):\n    return sum(prices)\n"})
    return made


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("work/shop", f"not the root of a git repository (it is inside the repository whose "
         f"root is {{base}}/work); {ADVICE}"),
        ("origin.git/refs", f"not the root of a git repository (it is inside the repository "
         f"whose root is {{base}}/origin.git); {ADVICE}"),
        ("plain", f"not a git repository; {ADVICE}"),
        ("missing", "no such folder; give the root of a git repository (or its URL)"),
    ],
    ids=["a folder inside a working tree", "a folder inside a bare repository",
         "a plain folder", "a path that does not exist"],
)  # fmt: skip
def test_enqueue_refuses_a_path_that_is_not_a_repository_root_and_writes_nothing(
    given: str,
    said: str,
    upstream: Upstream,
    unit_redis_url: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (upstream.base / "plain").mkdir()
    monkeypatch.chdir(upstream.base)

    with pytest.raises(RepoError) as caught:
        api.enqueue(
            SENTRY_EVENT.read_bytes(), repo=given, settings=Settings(redis_url=unit_redis_url)
        )

    assert str(caught.value) == f"{given}: {said.format(base=upstream.base)}"
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("which", ["work", "bare"])
def test_enqueue_pins_the_head_of_a_working_tree_or_a_bare_repository(
    which: str, upstream: Upstream, unit_redis_url: str, redis_client: redis.Redis, git: Git
) -> None:
    root = upstream.work if which == "work" else upstream.bare
    settings = Settings(redis_url=unit_redis_url)

    run_id = api.enqueue(SENTRY_EVENT.read_bytes(), repo=str(root), settings=settings)

    run = api.get_run(run_id, settings=settings)
    assert (run.repo, run.commit) == (str(root), git("rev-parse", "HEAD", cwd=root))


def test_baton_enqueue_with_a_folder_inside_a_repository_exits_2_naming_it_and_writes_nothing(
    upstream: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.control.cli",
            "enqueue",
            str(SENTRY_EVENT),
            "--repo",
            "shop",
        ],
        cwd=upstream.work,
        env={**os.environ, "BATON_REDIS_URL": unit_redis_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: shop: not the root of a git repository (it is inside the repository "
        f"whose root is {upstream.work}); {ADVICE}\n"
    )
    assert done.stdout == ""
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("setup = [", "not a readable TOML file"),
        ("[env]\nAWS_SECRET_ACCESS_KEY = 'x'", "env: AWS_SECRET_ACCESS_KEY looks like a secret"),
        ('packages = ["curl; rm -rf /"]', "is not a Debian package name"),
        ("tests = 'pytest'", "tests: Extra inputs are not permitted"),
        ("source = 'detected'", "source: Baton sets it"),
        ("built = 1979-05-27", "built: Extra inputs are not permitted"),
    ],
)
def test_enqueue_refuses_a_bad_environment_file_naming_it_and_writes_nothing(
    text: str, fault: str, upstream: Upstream, unit_redis_url: str, redis_client: redis.Redis,
    tmp_path: Path,
) -> None:  # fmt: skip
    spec = tmp_path / "env.toml"
    spec.write_text(text)

    with pytest.raises(EnvironmentFileError) as caught:
        api.enqueue(
            SENTRY_EVENT.read_bytes(),
            repo=str(upstream.work),
            environment=spec,
            settings=Settings(redis_url=unit_redis_url),
        )

    assert str(caught.value).startswith(f"{spec}: ")
    assert fault in str(caught.value)
    assert redis_client.dbsize() == 0


def test_an_environment_file_given_at_enqueue_travels_with_the_run(
    upstream: Upstream, unit_redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    spec = tmp_path / "env.toml"
    spec.write_text('setup = ["pip install ."]\ntest = "pytest -q"\n[env]\nTZ = "UTC"\n')
    settings = Settings(redis_url=unit_redis_url)

    run_id = api.enqueue(
        SENTRY_EVENT.read_bytes(), repo=str(upstream.work), environment=spec, settings=settings
    )

    run = api.get_run(run_id, settings=settings)
    assert run.environment_spec == {
        "setup": ["pip install ."],
        "test": "pytest -q",
        "env": {"TZ": "UTC"},
    }


def test_the_same_issue_in_another_environment_is_another_run(
    upstream: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=unit_redis_url)
    event, repo = SENTRY_EVENT.read_bytes(), str(upstream.work)
    pytest_env = {"setup": ["pip install -e ."], "test": "pytest -q"}

    plain = api.submit(event, repo=repo, settings=settings)
    given = api.submit(event, repo=repo, environment=pytest_env, settings=settings)
    again = api.submit(event, repo=repo, environment=dict(reversed(pytest_env.items())),
                       settings=settings)  # fmt: skip
    other = api.submit(event, repo=repo, environment={"test": "pytest -x"}, settings=settings)

    assert [created for _, created in (plain, given, again, other)] == [True, True, False, True]
    assert again[0] == given[0]  # the same spec, written in another order
    assert len({plain[0], given[0], other[0]}) == 3
