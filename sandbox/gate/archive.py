"""What an uploaded archive (`PUT /containers/{id}/archive`) may hold, member by member.

dockerd unpacks an upload inside the container's root, following the symbolic links it finds
on the way, even into the read-only root: `esc -> /etc` then `esc/pwned` writes `/etc/pwned`.
So an archive passes only when none of its members can reach outside the folder it is unpacked
into or make anything a sandbox must not have:

- a plain tar (a compressed one is refused: the gate does not unpack a bomb to read it);
- names relative, without a `..` segment;
- regular files, folders, symbolic links and hard links only: no device, fifo or other node;
- no setuid or setgid bit;
- a symbolic link's target stays inside the archive's folder (relative, never above it);
  a hard link names a regular file the archive holds before it;
- no member passes through a symbolic link: one the archive holds, or, in the container, one
  the folder already holds (`parents_to_check` names the folders the gate must look at there:
  those the archive does not make itself before it writes into them).

The archive is read with Python's tarfile over the spooled upload; only headers are read.
"""

from __future__ import annotations

import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from posixpath import dirname, join, normpath
from typing import IO

from sandbox.gate.errors import Refused

KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "folder",
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
}
"""The member types an upload may hold."""
NODES = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device",
         tarfile.FIFOTYPE: "fifo", tarfile.CONTTYPE: "contiguous file"}  # fmt: skip
PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


@dataclass
class Checked:
    """What an archive that passed needs checked in the container."""

    parents_to_check: list[str] = field(default_factory=list)
    """Folders (relative to the upload's target) a member is written into that the archive
    does not make before: each must not be a symbolic link in the container."""


def check(fileobj: IO[bytes]) -> Checked:
    """Read the archive `fileobj` (seekable) member by member; `Refused`, naming the first
    member that breaks a rule and the rule, if one does."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as archive:
            return check_members(archive)
    except tarfile.ReadError as exc:
        raise Refused(f"the archive is not a plain tar ({exc}): upload it uncompressed") from None


def check_members(members: Iterable[tarfile.TarInfo]) -> Checked:
    """`check` over members already read."""
    links: set[str] = set()
    made: set[str] = set()
    files: set[str] = set()
    to_check: dict[str, None] = {}
    for member in members:
        name = _name(member)
        refusal = _refusal(member, name, files)
        if refusal is not None:
            raise Refused(f"member {member.name[:200]!r}: {refusal}")
        for parent in _parents(name):
            if parent in links:
                raise Refused(
                    f"member {member.name[:200]!r}: its path passes through the symbolic link "
                    f"{parent!r} the archive holds"
                )
            if parent not in made:
                to_check.setdefault(parent)
        if member.issym():
            links.add(name)
        elif member.isdir():
            made.add(name)
        elif member.isfile():
            files.add(name)
    return Checked(list(to_check))


def _name(member: tarfile.TarInfo) -> str:
    """The member's name without a leading `./` or trailing `/`; `.` for the archive's own
    folder."""
    name = member.name
    if name.startswith("/"):
        raise Refused(f"member {name[:200]!r}: an absolute name (names are relative)")
    if ".." in name.split("/"):
        raise Refused(f"member {name[:200]!r}: a '..' segment (names stay inside the folder)")
    return normpath(name)


def _refusal(member: tarfile.TarInfo, name: str, files: set[str]) -> str | None:
    if member.type in NODES:
        return f"a {NODES[member.type]}: an upload holds files, folders and links only"
    if member.type not in KINDS:
        return f"an entry of tar type {member.type!r}: files, folders and links only"
    if member.mode & PRIVILEGE_BITS:
        return f"mode {member.mode:o} sets setuid or setgid: no upload grants privileges"
    if member.issym():
        return _link_refusal(name, member.linkname)
    if member.islnk():
        target = member.linkname
        if target.startswith("/") or ".." in target.split("/") or normpath(target) not in files:
            return (
                f"a hard link to {target[:200]!r}: a hard link names a regular file the "
                "archive holds before it"
            )
    return None


def _link_refusal(name: str, target: str) -> str | None:
    if target.startswith("/"):
        return f"a symbolic link to the absolute path {target[:200]!r}: links stay inside"
    resolved = normpath(join(dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        return f"a symbolic link to {target[:200]!r}, outside the folder it is unpacked into"
    return None


def _parents(name: str) -> list[str]:
    """The folders `name` is written into, from the top (the target itself excluded)."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts)) if parts[i] != "."]
