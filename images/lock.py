"""requirements.lock read as data: the one list of Python packages Baton installs.

`make lock` (scripts/lock.sh) writes it with uv: for each package one exact version, an
environment marker where it is needed on some interpreters only, and the sha256 of every file
of that version. `make setup` and CI install it with scripts/install-lock.sh: `pip install
--require-hashes --no-deps`, so pip resolves nothing against the index, then `python -m
images.lock verify`, which holds what was installed to the lock (`verify`). The image build
(`images.build`) takes the part of it Baton's service needs, with the same hashes; the tests
compare a venv, and pyproject.toml, with it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
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
        """`name==version ; marker --hash=...`, as `pip install --require-hashes -r` takes it."""
        hashes = " ".join(f"--hash=sha256:{digest}" for digest in sorted(self.sha256))
        return f"{self.constraint()} {hashes}"

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


# What an installed environment is held to -------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """One distribution found in a site-packages folder."""

    name: str
    """Normalised (PEP 503)."""
    version: str
    requires: tuple[Requirement, ...]


def installed(sites: Iterable[Path]) -> dict[str, Installed]:
    """Every distribution installed in the `sites` folders, by normalised name (the first found
    where one is in two)."""
    found: dict[str, Installed] = {}
    for dist in metadata.distributions(path=[str(site) for site in sites]):
        name = canonicalize_name(dist.metadata["Name"] or "")
        if not name or name in found:
            continue
        requires = tuple(Requirement(line) for line in dist.requires or ())
        found[name] = Installed(name, dist.version, requires)
    return found


def differences(pins: dict[str, Pin], have: dict[str, Installed]) -> list[str]:
    """What differs between the lock's pins that apply here and what is installed: a pin
    missing, or installed at another version. Packages the lock does not list are not
    differences (the project itself, installed after the lock, is one)."""
    problems: list[str] = []
    for pin in sorted(pins.values(), key=lambda p: p.name):
        if not pin.applies():
            continue
        got = have.get(pin.name)
        if got is None:
            problems.append(f"{pin.name}=={pin.version} is locked but not installed")
        elif got.version != pin.version:
            problems.append(f"{pin.name} is {got.version}, the lock pins {pin.version}")
    return problems


def unmet(have: dict[str, Installed]) -> list[str]:
    """Every requirement of an installed distribution that what is installed does not meet,
    extras included: `google-adk` asking for `google-auth[pyopenssl]` needs pyopenssl too.
    Each as `who needs what (and what is there)`."""
    problems: list[str] = []
    wanted: list[tuple[str, str]] = [(name, "") for name in have]
    seen: set[tuple[str, str]] = set()
    while wanted:
        who, extra = wanted.pop()
        if (who, extra) in seen:
            continue
        seen.add((who, extra))
        for req in have[who].requires:
            if not _applies(req, extra):
                continue
            name = canonicalize_name(req.name)
            label = f"{who}[{extra}]" if extra else who
            target = have.get(name)
            if target is None:
                problems.append(f"{label} needs {req}, which is not installed")
                continue
            if not req.specifier.contains(target.version, prereleases=True):
                problems.append(f"{label} needs {req}, {name} {target.version} is installed")
            wanted.extend((name, wanted_extra) for wanted_extra in sorted(req.extras))
    return sorted(set(problems))


def _applies(req: Requirement, extra: str) -> bool:
    """Whether `req`, listed by a distribution installed with `extra` ("" for none), applies
    on this interpreter."""
    if req.marker is None:
        return not extra
    return req.marker.evaluate({"extra": extra})


def verify(sites: Sequence[Path], lock: Path = LOCK) -> list[str]:
    """What is wrong with the environment in `sites` against the lock at `lock`: the
    differences and the unmet requirements; empty when it is exactly the lock's."""
    have = installed(sites)
    return differences(read(lock), have) + unmet(have)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m images.lock verify [--lock FILE] SITE...`: exit 1, naming each problem, when
    the environment installed in the SITE folders is not exactly the lock's."""
    parser = argparse.ArgumentParser(prog="python -m images.lock")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="hold an installed environment to the lock")
    check.add_argument("--lock", type=Path, default=LOCK)
    check.add_argument("sites", type=Path, nargs="+", metavar="SITE")
    args = parser.parse_args(argv)
    try:
        problems = verify(args.sites, args.lock)
    except (LockError, OSError) as exc:
        print(f"lock: {exc}", file=sys.stderr)
        return 1
    if problems:
        print(f"lock: the installed environment is not {args.lock.name}'s:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print("  fix: `make lock`, then `make setup`", file=sys.stderr)
        return 1
    print(f"lock: the installed environment is exactly {args.lock.name}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
