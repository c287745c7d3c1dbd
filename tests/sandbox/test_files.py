"""Moving bytes in and out of a sandbox."""

from __future__ import annotations

import io
import tarfile

import pytest

from sandbox import DockerSandbox, SandboxFileError


def one_file_tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_written_bytes_read_back_unchanged(box: DockerSandbox) -> None:
    data = bytes(range(256)) * 1000
    box.write_file("/workspace/blob.bin", data)
    assert box.read_file("/workspace/blob.bin", max_bytes=len(data)) == data


def test_a_written_file_belongs_to_the_sandbox_user_with_mode_644(box: DockerSandbox) -> None:
    box.write_file("/workspace/a.txt", b"a")
    assert box.exec(["stat", "-c", "%u:%g %a", "/workspace/a.txt"]).output == "1000:1000 644\n"


def test_writing_makes_the_missing_directories_of_a_file(box: DockerSandbox) -> None:
    box.write_file("/workspace/new/deeper/c.txt", b"c")
    listing = box.exec(
        ["stat", "-c", "%u %a %n", "/workspace/new/deeper", "/workspace/new/deeper/c.txt"]
    )
    assert (
        listing.output == "1000 755 /workspace/new/deeper\n1000 644 /workspace/new/deeper/c.txt\n"
    )


def test_files_can_be_written_to_tmp(box: DockerSandbox) -> None:
    box.write_file("/tmp/patch.diff", b"--- a\n+++ b\n")
    assert box.exec(["cat", "/tmp/patch.diff"]).output == "--- a\n+++ b\n"


def test_rewriting_a_file_keeps_its_mode(box: DockerSandbox) -> None:
    box.write_file("/workspace/run.sh", b"#!/bin/sh\necho one\n")
    assert box.exec(["chmod", "755", "/workspace/run.sh"]).exit_code == 0
    box.write_file("/workspace/run.sh", b"#!/bin/sh\necho two\n")
    assert box.exec(["/workspace/run.sh"]).output == "two\n"


def test_a_file_larger_than_allowed_is_refused(box: DockerSandbox) -> None:
    box.write_file("/workspace/big.txt", b"x" * 1000)
    assert box.read_file("/workspace/big.txt", max_bytes=1000) == b"x" * 1000
    with pytest.raises(SandboxFileError, match="1000 bytes, more than the 999 bytes allowed"):
        box.read_file("/workspace/big.txt", max_bytes=999)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/workspace/missing.txt", "Could not find the file"),
        ("/workspace", "is a directory"),
        ("/tmp/patch.diff", "tmpfs"),
    ],
)
def test_reading_what_is_not_a_file_is_refused(box: DockerSandbox, path: str, message: str) -> None:
    with pytest.raises(SandboxFileError, match=message):
        box.read_file(path, max_bytes=1000)


def test_a_symbolic_link_is_read_through(box: DockerSandbox) -> None:
    box.write_file("/workspace/target.txt", b"target")
    assert box.exec(["ln", "-s", "target.txt", "/workspace/link"]).exit_code == 0
    assert box.read_file("/workspace/link", max_bytes=100) == b"target"


def test_writing_into_the_read_only_root_is_refused(box: DockerSandbox) -> None:
    with pytest.raises(SandboxFileError, match="Read-only file system"):
        box.write_file("/etc/evil", b"x")


def test_an_archive_unpacks_into_the_workspace(box: DockerSandbox) -> None:
    box.put_archive("/workspace", one_file_tar("src/app.py", b"print('hi')\n"))
    result = box.exec(["python3", "src/app.py"])
    assert (result.exit_code, result.output) == (0, "hi\n")
    assert box.exec(["stat", "-c", "%u:%g", "src/app.py"]).output == "1000:1000\n"


def test_an_archive_cannot_unpack_outside_the_workspace(box: DockerSandbox) -> None:
    with pytest.raises(SandboxFileError, match="read-only"):
        box.put_archive("/etc", one_file_tar("evil", b"x"))
