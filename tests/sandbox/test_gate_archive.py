"""The gate's reading of an uploaded archive (`sandbox/gate/archive.py`), member by member:
each hostile member is refused with its name and reason, and the same archive without it
passes."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from sandbox.gate import archive
from sandbox.gate.errors import Refused
from tests.repos import Git
from workers.mirrors import RepoCache

Member = tuple[str, bytes, str]
"""A member to write: its name, its kind (`tarfile` type) and its link target or data."""


def tar_of(members: Sequence[Member], *, mode: int = 0o644) -> bytes:
    """An archive of `(name, type, data or link target)` members, owned by 1000:1000."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as written:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type, info.uid, info.gid = kind, 1000, 1000
            info.mode = 0o755 if kind == tarfile.DIRTYPE else mode
            data = None
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = payload
            elif kind in (tarfile.REGTYPE,):
                data = payload.encode()
                info.size = len(data)
            written.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def reason_for(raw: bytes) -> str:
    with pytest.raises(Refused) as refused:
        archive.check(io.BytesIO(raw))
    return refused.value.reason


FILE, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
BENIGN = [("src", DIR, ""), ("src/a.py", FILE, "print(1)\n"), ("src/b.py", LNK, "src/a.py"),
          ("link", SYM, "src/a.py"), ("src/up", SYM, "../src")]  # fmt: skip
"""Files, folders and links that stay inside, as `git archive` makes them."""


@pytest.mark.parametrize(
    ("hostile", "member", "words"),
    [
        ([("esc", SYM, "/etc"), ("esc/pwned", FILE, "x")], "esc", "absolute path '/etc'"),
        ([("esc", SYM, "src"), ("esc/in", FILE, "x")], "esc/in", "the symbolic link 'esc'"),
        ([("out", SYM, "../../etc")], "out", "outside the folder"),
        ([("/etc/pwned", FILE, "x")], "/etc/pwned", "absolute name"),
        ([("src/../../pwned", FILE, "x")], "src/../../pwned", "'..' segment"),
        ([("hard", LNK, "/etc/passwd")], "hard", "a hard link to '/etc/passwd'"),
        ([("hard", LNK, "nowhere")], "hard", "a regular file the archive holds before it"),
        ([("null", tarfile.CHRTYPE, "")], "null", "a character device"),
        ([("disk", tarfile.BLKTYPE, "")], "disk", "a block device"),
        ([("pipe", tarfile.FIFOTYPE, "")], "pipe", "a fifo"),
    ],
    ids=["symlink-to-etc-then-through-it", "through-an-inner-symlink", "symlink-above",
         "absolute", "dotdot", "hardlink-absolute", "hardlink-to-nothing", "char-device",
         "block-device", "fifo"],
)  # fmt: skip
def test_a_hostile_member_is_refused_by_name_and_the_archive_without_it_passes(
    hostile: list[Member], member: str, words: str
) -> None:
    reason = reason_for(tar_of([*BENIGN, *hostile]))
    assert f"member {member!r}" in reason and words in reason
    assert archive.check(io.BytesIO(tar_of(BENIGN))).parents_to_check == []


@pytest.mark.parametrize("bit", [0o4000, 0o2000], ids=["setuid", "setgid"])
def test_a_setuid_or_setgid_file_is_refused_and_a_plain_executable_passes(bit: int) -> None:
    reason = reason_for(tar_of([("tool", FILE, "x")], mode=0o755 | bit))
    assert "member 'tool'" in reason and "setuid or setgid" in reason
    archive.check(io.BytesIO(tar_of([("tool", FILE, "x")], mode=0o755)))


def test_a_compressed_archive_is_refused_and_the_same_one_plain_passes() -> None:
    plain = tar_of(BENIGN)
    assert "not a plain tar" in reason_for(gzip.compress(plain))
    archive.check(io.BytesIO(plain))


def test_folders_the_archive_writes_into_without_making_them_are_checked_in_the_container() -> None:
    made_first = tar_of([("a", DIR, ""), ("a/b", DIR, ""), ("a/b/f", FILE, "x")])
    assert archive.check(io.BytesIO(made_first)).parents_to_check == []
    not_made = tar_of([("./a/b/f", FILE, "x"), ("a/g", FILE, "y"), ("./h", FILE, "z")])
    assert archive.check(io.BytesIO(not_made)).parents_to_check == ["a", "a/b"]


def test_a_folder_made_after_a_file_written_into_it_does_not_count_as_made() -> None:
    late = tar_of([("a/f", FILE, "x"), ("a", DIR, "")])
    assert archive.check(io.BytesIO(late)).parents_to_check == ["a"]


def test_a_tree_as_baton_archives_it_passes_with_its_links_and_nothing_to_check(
    git: Git, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "docs").symlink_to("src/pkg")
    git("init", "-q", repo)
    git("-C", repo, "add", "-A")
    git("-C", repo, "commit", "-qm", "tree")
    commit = git("-C", repo, "rev-parse", "HEAD")
    tree = RepoCache(tmp_path / "mirrors").archive(str(repo), commit, uid=1000, gid=1000)
    assert archive.check(io.BytesIO(tree)).parents_to_check == []
    names = {member.name for member in tarfile.open(fileobj=io.BytesIO(tree))}
    assert {"src/pkg/mod.py", "run.sh", "docs"} <= names  # what was checked is the whole tree
