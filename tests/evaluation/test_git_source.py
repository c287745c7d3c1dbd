"""Instances whose source is a git commit: the folder holds the base tree as `base.tar.gz`, the
loader requires it (and `break.patch` only of a PyPI source), `materialize` makes it a bare
repository without a network, and a hostile archive is refused with nothing unpacked."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from evaluation.corpus import (
    CorpusError,
    GitSource,
    load_corpus,
    load_instance,
    materialize,
    unpack_base,
)
from evaluation.swebench import Repos, load_records, read_records
from tests.repos import Git

BASE = "0123456789abcdef0123456789abcdef01234567"
GIT_INSTANCE = f"""id = "calc-abc1234-mean-empty"
summary = "mean([]) raises ZeroDivisionError"
upstream = "https://github.com/example/calc/commit/abc1234"
[source]
git = "https://github.com/example/calc"
commit = "{BASE}"
[environment]
test = "python -m pytest -q"
env = {{ SETUPTOOLS_SCM_PRETEND_VERSION = "1.0" }}
[tests]
runner = "pytest"
fail_to_pass = ["tests/test_core.py::test_mean_of_nothing"]
"""
CORE = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n"
TEST = "from calc.core import mean\n"
GOLD = """diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,3 +1,3 @@
 def mean(values):
     total = sum(values)
-    return total / len(values)
+    return total / len(values) if values else 0
"""
TESTS = """diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1 +1,4 @@
 from calc.core import mean
+
+def test_mean_of_nothing():
+    assert mean([]) == 0
"""
ISSUE = {"number": 7, "title": "mean() of an empty list crashes", "body": "ZeroDivisionError"}


def archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """A gzipped tar of exactly these members (a hostile one, if they say so)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out.getvalue()


def member(
    name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info, data


def make_git_instance(root: Path, **replace: str | bytes) -> Path:
    folder = root / "calc-abc1234-mean-empty"
    folder.mkdir(parents=True)
    base = archive([member("calc/core.py", CORE.encode()), member("tests/test_core.py",
                                                                  TEST.encode())])  # fmt: skip
    files: dict[str, str | bytes] = {
        "instance.toml": GIT_INSTANCE, "test.patch": TESTS, "gold.patch": GOLD,
        "issue.json": json.dumps(ISSUE), "base.tar.gz": base, **replace,
    }  # fmt: skip
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)
    return folder


def test_a_git_instance_is_read_with_its_commit_and_no_break_patch(tmp_path: Path) -> None:
    instance = load_instance(make_git_instance(tmp_path))

    assert instance.source == GitSource(git="https://github.com/example/calc", commit=BASE)
    assert str(instance.source) == "https://github.com/example/calc at 0123456789ab"
    assert instance.environment["env"] == {"SETUPTOOLS_SCM_PRETEND_VERSION": "1.0"}
    assert instance.files("test.patch") == ["tests/test_core.py"]


@pytest.mark.parametrize(
    ("replace", "said"),
    [
        ({"instance.toml": GIT_INSTANCE.replace("[source]", '[source]\nbranch = "main"')},
         "source.git.branch\n  Extra inputs are not permitted"),
        ({"instance.toml": GIT_INSTANCE.replace(BASE, "abc1234")},
         "source.git.commit\n  String should match pattern"),
        ({"instance.toml": GIT_INSTANCE.replace('[source]', '[source]\nversion = "1.0"')},
         "source.git.version\n  Extra inputs are not permitted"),
        ({"instance.toml": GIT_INSTANCE.replace('git = "https://github.com/example/calc"\n',
                                                "")}, "source.pypi.pypi\n  Field required"),
    ],
)  # fmt: skip
def test_a_bad_git_source_is_refused_naming_the_file_and_key(
    tmp_path: Path, replace: dict[str, str], said: str
) -> None:
    with pytest.raises(CorpusError) as raised:
        load_instance(make_git_instance(tmp_path, **replace))
    assert str(raised.value).startswith(f"{tmp_path}/calc-abc1234-mean-empty/instance.toml: ")
    assert said in str(raised.value)


def test_each_source_requires_its_own_base_file(tmp_path: Path) -> None:
    git_folder = make_git_instance(tmp_path / "git")
    (git_folder / "base.tar.gz").unlink()
    (git_folder / "break.patch").write_text("x")  # a PyPI instance's file is no base for git
    with pytest.raises(CorpusError, match=r"calc-abc1234-mean-empty: base\.tar\.gz is missing"):
        load_instance(git_folder)

    pypi = GIT_INSTANCE.replace('git = "https://github.com/example/calc"', 'pypi = "calc"')
    pypi_folder = make_git_instance(
        tmp_path / "pypi", **{"instance.toml": pypi.replace(f'commit = "{BASE}"', 'version = "1"')}
    )
    with pytest.raises(CorpusError, match=r"break\.patch is missing"):
        load_instance(pypi_folder)


def test_a_git_instance_materializes_as_a_bare_repository_of_its_base(
    tmp_path: Path, git: Git
) -> None:
    instance = load_instance(make_git_instance(tmp_path / "corpus"))

    checkout = materialize(instance, tmp_path / "repos", tmp_path / "downloads")

    assert git("--git-dir", checkout.remote, "rev-parse", "--is-bare-repository") == "true"
    assert git("--git-dir", checkout.remote, "rev-parse", "HEAD") == checkout.commit
    listed = git("--git-dir", checkout.remote, "ls-tree", "-r", "--name-only", checkout.commit)
    assert listed.splitlines() == ["calc/core.py", "tests/test_core.py"]
    assert git("--git-dir", checkout.remote, "show", f"{checkout.commit}:calc/core.py") == (
        CORE.strip()
    )
    message = git("--git-dir", checkout.remote, "log", "-1", "--format=%s", checkout.commit)
    assert message == (
        "calc-abc1234-mean-empty: the base (https://github.com/example/calc at 0123456789ab)"
    )
    assert not (tmp_path / "downloads").exists()  # nothing fetched
    clone = tmp_path / "clone"
    git("clone", "-q", checkout.remote, clone)
    for patch in (TESTS, GOLD):
        (clone / "p.diff").write_text(patch)
        git("apply", "p.diff", cwd=clone)
    assert "if values else 0" in (clone / "calc" / "core.py").read_text()


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([member("../escaped.txt", b"x")], "escaped.txt"),
        ([member("/tmp/absolute.txt", b"x")], "absolute.txt"),
        ([member("link", kind=tarfile.SYMTYPE, link="../../outside")], "link"),
        ([member("etc", kind=tarfile.SYMTYPE, link="/etc")], "etc"),
        ([member("calc/up", kind=tarfile.SYMTYPE, link="../../..")], "calc/up"),
        ([member("hard", kind=tarfile.LNKTYPE, link="../../outside")], "hard"),
        ([member("fifo", kind=tarfile.FIFOTYPE)], "fifo"),
        ([member(".git/config", b"[core]\n")], ".git"),
    ],
)  # fmt: skip
def test_a_hostile_base_archive_is_refused_and_nothing_is_kept(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], said: str
) -> None:
    bad = tmp_path / "base.tar.gz"
    bad.write_bytes(archive([member("calc/core.py", CORE.encode()), *members]))
    dest = tmp_path / "a" / "b" / "tree"

    with pytest.raises(CorpusError, match=rf"base\.tar\.gz: .*{said}"):
        unpack_base(bad, dest)

    assert not dest.exists()
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == ["a", "a/b", "base.tar.gz"]
    assert not Path("/tmp/absolute.txt").exists()


def test_a_base_archive_that_would_unpack_too_large_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    # 600 MiB of zeros: a few hundred kilobytes gzipped
    zeros = tarfile.TarInfo("calc/zeros.bin")
    zeros.size = 600 * 1024 * 1024
    bad = tmp_path / "base.tar.gz"
    with tarfile.open(bad, "w:gz", compresslevel=1) as tar:
        tar.addfile(zeros, _Zeros(zeros.size))
    assert bad.stat().st_size < 5 * 1024 * 1024
    dest = tmp_path / "tree"

    with pytest.raises(CorpusError, match=r"base\.tar\.gz: unpacks to 629,145,600 bytes in 1 "):
        unpack_base(bad, dest)

    assert not dest.exists()


class _Zeros:
    """A file of `size` zero bytes, read without holding them."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def test_a_base_archive_that_is_not_a_tar_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "base.tar.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(CorpusError, match=r"base\.tar\.gz: not a tree that can be unpacked"):
        unpack_base(bad, tmp_path / "tree")


SHIPPED = Path(__file__).resolve().parents[2] / "eval" / "corpus"


def test_the_shipped_swebench_file_is_the_shipped_git_instances_and_reads_back_as_them(
    tmp_path: Path, git: Git
) -> None:
    """Each record of eval/corpus/swebench-git.jsonl is a git instance of the corpus; read with
    repositories made from the instances' own base archives (the same trees, under commits of
    their own: CI has no clone of the projects), each gives that instance's tests and
    environment."""
    folders = {i.source.commit: i for i in load_corpus(SHIPPED) if isinstance(i.source, GitSource)}
    records = read_records(SHIPPED / "swebench-git.jsonl")
    assert len(records) >= 5
    assert sorted(r.base_commit for _, r in records) == sorted(folders)
    remade = []
    for number, (_, found) in enumerate(records):
        instance = folders[found.base_commit]
        assert instance.source.git == f"https://github.com/{found.repo}"  # type: ignore[union-attr]
        assert found.patch == instance.text("gold.patch")
        assert found.test_patch == instance.text("test.patch")
        assert found.FAIL_TO_PASS == instance.tests.fail_to_pass
        assert found.PASS_TO_PASS == instance.tests.pass_to_pass
        assert found.problem_statement == f"{instance.title}\n\n{instance.issue['body']}"
        tree = tmp_path / "trees" / str(number)
        unpack_base(instance.folder / "base.tar.gz", tree)
        git("init", "-q", cwd=tree)
        git("add", "-A", "--force", cwd=tree)
        git("commit", "-q", "-m", "base", cwd=tree)
        bare = tmp_path / "repos" / found.repo.replace("/", "+")
        if not bare.exists():
            git("init", "-q", "--bare", bare)
        git("--git-dir", bare, "fetch", "-q", tree, f"HEAD:refs/heads/base-{number}")
        remade.append(found.model_dump() | {"base_commit": git("rev-parse", "HEAD", cwd=tree)})
    path = tmp_path / "remade.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in remade))

    loaded = load_records(path, Repos(folder=tmp_path / "repos"), tmp_path / "work")

    for (_, found), instance in zip(records, loaded, strict=True):
        shipped = folders[found.base_commit]
        assert instance.tests == shipped.tests, instance.id
        detected = {k: v for k, v in instance.environment.items()
                    if k not in ("inputs", "languages")}  # fmt: skip
        assert detected == shipped.environment, instance.id
        assert instance.title == shipped.title
