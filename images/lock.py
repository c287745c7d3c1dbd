"""requirements.lock read as data: the one list of Python packages Baton installs.

`make lock` (scripts/lock.sh) writes it with uv: for each package one exact version, an
environment marker where it is needed on some interpreters only, and the sha256 of every file
of that version. `make setup` and CI install it with `pip install --require-hashes`; the image
build (`images.build`) takes the part of it Baton's service needs, with the same hashes; the
tests compare a venv, and pyproject.toml, with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"


class LockError(ValueError):
    """Raised when requirements.lock holds an entry that is not one exact version with its
    hashes; the message names the entry."""


@dataclass(frozen=True)
class Pin:
    """One package of the lock."""

    name: str
    """Normalised (PEP 503): `google-genai`, `pyyaml`."""
    version: str
    marker: Marker | None
    """Where the package is needed; None: everywhere."""
    sha256: frozenset[str]
    """The hex digests of every file of this version the index had."""

    def applies(self) -> bool:
        """Whether the running interpreter installs this package."""
        return self.marker is None or self.marker.evaluate()

    def constraint(self) -> str:
        """`name==version ; marker`, as a pip constraints file takes it (no hashes)."""
        return f"{self.name}=={self.version}" + (f" ; {self.marker}" if self.marker else "")

    def requirement(self) -> str:
        """`name==version --hash=...`, as `pip install --require-hashes -r` takes it."""
        hashes = " ".join(f"--hash=sha256:{digest}" for digest in sorted(self.sha256))
        return f"{self.name}=={self.version} {hashes}"

    def matches(self, path: Path) -> bool:
        """Whether the file at `path` is one of this version's files, by its sha256."""
        return hashlib.sha256(path.read_bytes()).hexdigest() in self.sha256


def read(path: Path = LOCK) -> dict[str, Pin]:
    """Every pin of the lock at `path`, by normalised name.

    Raises:
        LockError: an entry without an exact version or without a hash, or one listed twice.
    """
    pins: dict[str, Pin] = {}
    for entry in _entries(path.read_text()):
        pin = _pin(entry)
        if pin.name in pins:
            raise LockError(f"{path.name}: {pin.name} is listed twice")
        pins[pin.name] = pin
    return pins


def _entries(text: str) -> list[str]:
    """The lock's requirement lines, each with its continuation lines joined; comments out."""
    entries: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        content = "" if line.lstrip().startswith("#") else line.strip()
        current.append(content.removesuffix("\\"))
        if not content.endswith("\\"):
            if " ".join(current).strip():
                entries.append(" ".join(current).strip())
            current = []
    return entries


def _pin(entry: str) -> Pin:
    words = entry.split()
    hashes = [word.removeprefix("--hash=") for word in words if word.startswith("--hash=")]
    requirement = " ".join(word for word in words if not word.startswith("--hash="))
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        raise LockError(f"requirements.lock: {requirement!r} is not a requirement: {exc}") from exc
    specifiers = list(parsed.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        raise LockError(f"requirements.lock: {requirement!r} is not one exact version (==)")
    digests = frozenset(h.removeprefix("sha256:") for h in hashes if h.startswith("sha256:"))
    if not digests or len(digests) != len(hashes):
        raise LockError(f"requirements.lock: {parsed.name} needs sha256 hashes, and only those")
    return Pin(canonicalize_name(parsed.name), specifiers[0].version, parsed.marker, digests)
