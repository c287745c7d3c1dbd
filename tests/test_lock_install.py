"""scripts/install-lock.sh installs exactly the lock, whatever the index offers that day.

Each test builds an index of its own: a folder of wheels made here, where `app` 1.0 asks for
`dep[extra]>=1.0`, the lock pins `dep` 1.0, and `dep` 1.1, newer than the lock, has come out
since (as google-auth 2.63.1 did after a lock that pinned 2.63.0). The machine's pip
configuration is left out (PIP_CONFIG_FILE), pip sees only this folder.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-lock.sh"

pytestmark = pytest.mark.integration


def wheel(
    index: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    extras: tuple[str, ...] = (),
) -> Path:
    """A pure-Python wheel of `name` `version`, with one module, `requires` as its
    Requires-Dist lines and `extras` as the extras it provides, written into `index`."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Provides-Extra: {e}" for e in extras]
            + [f"Requires-Dist: {r}" for r in requires]
        )
        + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = index / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def pinned(path: Path, name: str, version: str) -> str:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"{name}=={version} \\\n    --hash=sha256:{digest}\n"


@pytest.fixture
def index(tmp_path: Path) -> dict[str, Path]:
    """The index folder and the wheels in it."""
    folder = tmp_path / "index"
    folder.mkdir()
    return {
        "folder": folder,
        "app": wheel(folder, "app", "1.0", ["dep[extra]>=1.0", 'helper>=1; extra == "never"']),
        "dep": wheel(folder, "dep", "1.0", ('extradep>=2; extra == "extra"',), ("extra",)),
        "dep-new": wheel(folder, "dep", "1.1", ('extradep>=2; extra == "extra"',), ("extra",)),
        "extradep": wheel(folder, "extradep", "2.0"),
    }


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A new virtualenv (with the pip that comes with this Python); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    return tmp_path / "venv" / "bin" / "python"


def pip_env(index: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(index),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # images.lock is read by this checkout's python (the venv has no `packaging`).
        "VERIFY_PYTHON": sys.executable,
    }
    return env


def install(venv: Path, lock: Path, index: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(venv), str(lock)],
        env=pip_env(index),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def version_of(venv: Path, name: str) -> str:
    done = subprocess.run(
        [str(venv), "-c", f"import {name}; print({name}.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_locked_version_is_installed_though_the_index_has_a_newer_one(
    tmp_path: Path, index: dict[str, Path], venv: Path
) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        pinned(index["app"], "app", "1.0")
        + pinned(index["dep"], "dep", "1.0")
        + pinned(index["extradep"], "extradep", "2.0")
    )

    done = install(venv, lock, index["folder"])

    assert done.returncode == 0, done.stdout + done.stderr
    assert (version_of(venv, "app"), version_of(venv, "dep")) == ("1.0", "1.0")
    assert version_of(venv, "extradep") == "2.0"


def test_control_a_resolving_install_of_the_same_lock_fails_on_the_newer_release(
    tmp_path: Path, index: dict[str, Path], venv: Path
) -> None:
    """What `make setup` did before: pip resolves `app`'s `dep[extra]` against the index, takes
    the newer dep, and --require-hashes refuses it (the failure every fresh machine met)."""
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        pinned(index["app"], "app", "1.0")
        + pinned(index["dep"], "dep", "1.0")
        + pinned(index["extradep"], "extradep", "2.0")
    )

    done = subprocess.run(
        [str(venv), "-m", "pip", "install", "--require-hashes", "-r", str(lock)],
        env=pip_env(index["folder"]),
        capture_output=True,
        text=True,
    )

    assert done.returncode != 0
    assert "must have their versions pinned with ==" in done.stderr
    assert "dep-1.1" in done.stderr or "dep[extra]" in done.stderr


def test_a_lock_that_leaves_out_a_requirement_is_refused_by_name(
    tmp_path: Path, index: dict[str, Path], venv: Path
) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(pinned(index["app"], "app", "1.0") + pinned(index["dep"], "dep", "1.0"))

    done = install(venv, lock, index["folder"])

    assert done.returncode != 0
    assert "extradep" in done.stdout + done.stderr


def test_a_lock_that_leaves_out_a_base_requirement_is_refused_by_name(
    tmp_path: Path, index: dict[str, Path], venv: Path
) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        pinned(index["app"], "app", "1.0") + pinned(index["extradep"], "extradep", "2.0")
    )

    done = install(venv, lock, index["folder"])

    assert done.returncode != 0
    assert "app needs dep[extra]>=1.0, which is not installed" in done.stdout + done.stderr
