"""Reading one file out of a container through Docker's archive API, with a size bound."""

from __future__ import annotations

import io
import tarfile
from typing import Any

from sandbox.errors import SandboxFileError

TAR_SLACK_BYTES = 64 * 1024
"""Room for tar headers and padding around a file's bytes."""
DIRECTORY_BIT = 1 << 31
"""Go's `os.ModeDir`, as Docker reports a path's mode."""


def read_archive_file(api: Any, container_id: str, path: str, *, max_bytes: int) -> bytes:
    """The bytes of regular file `path` (a symbolic link is followed once); `SandboxFileError`
    when it is not a regular file or is larger than `max_bytes`, before its bytes are read."""
    chunks, info = api.get_archive(container_id, path)
    if info.get("linkTarget"):
        chunks, info = api.get_archive(container_id, info["linkTarget"])
    if info["mode"] & DIRECTORY_BIT:
        raise SandboxFileError(f"{path} is a directory, not a file")
    if info["size"] > max_bytes:
        raise SandboxFileError(
            f"{path} is {info['size']} bytes, more than the {max_bytes} bytes allowed"
        )
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        if len(buffer) > max_bytes + TAR_SLACK_BYTES:
            raise SandboxFileError(f"{path} grew past the {max_bytes} bytes allowed while read")
    with tarfile.open(fileobj=io.BytesIO(buffer), mode="r:") as archive:
        member = archive.next()
        extracted = archive.extractfile(member) if member and member.isfile() else None
        if extracted is None:
            raise SandboxFileError(f"{path} is not a regular file")
        data = extracted.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SandboxFileError(f"{path} is more than the {max_bytes} bytes allowed")
    return data
