"""Reading a repository's tree for its environment, without Docker: the spec and key come from
the tree's regular files, on every Python the worker may run on."""

from __future__ import annotations

import io
import tarfile
import time

import pytest
import redis

from workers import environments


def tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


TREE = {
    "requirements.txt": b"attrs==23.1\n",
    "app.py": b"",
    "tests/test_app.py": b"import pytest\n",
}


@pytest.mark.parametrize("with_data_filter", [True, False])
def test_the_spec_and_key_come_from_the_trees_files_with_or_without_tars_data_filter(
    monkeypatch: pytest.MonkeyPatch, with_data_filter: bool
) -> None:
    expected = environments._spec_and_key(tar(TREE), None, "base", "repo")
    if not with_data_filter:  # Debian bookworm's Python 3.11.2, in the service image
        monkeypatch.delattr(tarfile, "data_filter")

    spec, key = environments._spec_and_key(
        tar(TREE, links={"outside": "/etc/passwd"}), None, "base", "repo"
    )

    assert (spec, key) == expected
    assert spec.test == "python -m pytest"
    assert spec.inputs == ("requirements.txt",)


def test_a_tree_with_a_path_out_of_it_is_refused_without_the_data_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(tarfile, "data_filter")

    with pytest.raises(ValueError, match=r"'\.\./escape\.txt'"):
        environments._spec_and_key(tar({"../escape.txt": b"x"}), None, "base", "repo")


def test_a_builder_that_died_holds_the_build_lock_up_for_its_ttl_only(
    redis_client: redis.Redis,
) -> None:
    # A worker SIGKILLed mid-build: the lock stays, with the TTL it was last given, unrenewed.
    redis_client.set(environments.LOCK_PREFIX + "k1", "dead-builder", px=1500)
    started = time.monotonic()
    with environments.BuildLock(redis_client, "k1", ttl_s=1.5, wait_s=10):
        waited = time.monotonic() - started
    assert 1.0 < waited < 3.0
    assert not redis_client.exists(environments.LOCK_PREFIX + "k1")  # released after the block


def test_a_live_builder_keeps_its_lock_for_as_long_as_it_builds(redis_client: redis.Redis) -> None:
    with environments.BuildLock(redis_client, "k2", ttl_s=0.6, wait_s=1):
        time.sleep(2.0)  # more than three times the lock's TTL: renewed meanwhile
        assert redis_client.exists(environments.LOCK_PREFIX + "k2")
        with pytest.raises(environments.EnvironmentBuildError, match="no build lock after 1s"):
            with environments.BuildLock(redis_client, "k2", ttl_s=0.6, wait_s=1):
                pass
    assert not redis_client.exists(environments.LOCK_PREFIX + "k2")
