"""Whether a repository builds native code, and what that needs: Debian packages, the build
system's Python requirements, and the commands that rebuild it in the sandbox.

Signs read: `ext_modules`/`Extension(`/`cythonize(` in setup.py, `[tool.setuptools]
ext-modules`, C, C++, Cython or Rust sources outside the tests, docs and examples, the
`[build-system]` (scikit-build-core, meson-python, maturin, setuptools-rust), a Cargo.toml, and
for Node a `binding.gyp` (or `"gypfile": true`). The libraries a build names are installed where
the name is unambiguous: an `#include <yaml.h>` the tree does not hold itself, or
`libraries=["yaml"]` in setup.py (`HEADERS`, `LIBRARIES`); nothing is guessed beyond those
tables.

What the sandbox rebuilds (`build`), where the root filesystem is read-only (the venv
included), only /workspace and /tmp are writable and there is no network:

- setuptools extensions: `python setup.py build_ext --inplace`, which writes only into the tree;
  the setup installs the build requirements into the venv and the project with
  `--no-build-isolation`, so the rebuild finds Cython and setuptools offline.
- meson-python: no command. Its editable install rebuilds on import, with ninja, in a build
  folder inside the tree; it needs the build requirements in the venv (`--no-build-isolation`),
  which the setup does.
- scikit-build-core and maturin (and setuptools-rust): no command. Their rebuild is a new
  `pip install` (it writes into the venv, which is read-only there) or, for Rust, a cargo build
  that needs its crates downloaded again (offline it cannot); the setup builds them once, and a
  repository that wants a rebuild states its own `build` in `.baton/environment.toml`.
- node-gyp: the compiler only; `npm run build`, when the package has that script, is the
  rebuild (`sandbox.detection`).

Pure: reads files, runs nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".pyx", ".rs")
"""Sources that are compiled."""
HEADER_SUFFIXES = (".h", ".hpp")
COMPANIONS = {".c": (".h",), ".cc": (".h", ".hpp"), ".cpp": (".h", ".hpp"), ".cxx": (".h", ".hpp"),
              ".pyx": (".pxd", ".pxi"), ".rs": ()}  # fmt: skip
"""Files that a change to needs the same rebuild as the sources beside them."""
NOT_SHIPPED = frozenset(
    {"test", "tests", "testing", "doc", "docs", "benchmark", "benchmarks", "bench", "example",
     "examples", "node_modules", "build", "dist", "venv", "site-packages", "__pycache__"}
)  # fmt: skip
"""Folders whose sources the package does not build (test data, docs, examples)."""
MAX_WALKED = 5_000
"""Most files looked at to find native sources."""
MAX_READ = 200
"""Most native sources read for their `#include`s."""
READ_BYTES = 64_000

HEADERS = {
    "yaml.h": "libyaml-dev",
    "zlib.h": "zlib1g-dev",
    "ffi.h": "libffi-dev",
    "openssl/ssl.h": "libssl-dev",
    "openssl/evp.h": "libssl-dev",
    "libxml/parser.h": "libxml2-dev",
    "libxml/tree.h": "libxml2-dev",
    "libxslt/xslt.h": "libxslt1-dev",
    "sqlite3.h": "libsqlite3-dev",
    "bzlib.h": "libbz2-dev",
    "lzma.h": "liblzma-dev",
    "libpq-fe.h": "libpq-dev",
    "gmp.h": "libgmp-dev",
    "uv.h": "libuv1-dev",
    "expat.h": "libexpat1-dev",
    "zmq.h": "libzmq3-dev",
    "jpeglib.h": "libjpeg-dev",
    "png.h": "libpng-dev",
}
"""Headers each of which one Debian development package holds."""
LIBRARIES = {
    "yaml": "libyaml-dev",
    "z": "zlib1g-dev",
    "ffi": "libffi-dev",
    "ssl": "libssl-dev",
    "crypto": "libssl-dev",
    "xml2": "libxml2-dev",
    "xslt": "libxslt1-dev",
    "sqlite3": "libsqlite3-dev",
    "bz2": "libbz2-dev",
    "lzma": "liblzma-dev",
    "pq": "libpq-dev",
    "gmp": "libgmp-dev",
    "uv": "libuv1-dev",
    "expat": "libexpat1-dev",
    "zmq": "libzmq3-dev",
}
"""`libraries=[…]` names in setup.py, and the Debian package that links them."""

SETUPTOOLS_BACKENDS = ("", "setuptools.build_meta", "setuptools.build_meta:__legacy__")
"""Backends whose extensions `setup.py build_ext --inplace` rebuilds (none named: setuptools)."""
REBUILT_FROM_THE_VENV = ("setuptools", "meson-python")
"""Kinds whose rebuild uses the build requirements from the venv: the setup installs them there
and the project with `--no-build-isolation`. Others build isolated (their backends may add
requirements of their own while building, which an install without isolation would miss)."""
KNOWN_KINDS = ("setuptools", "setuptools-rust", "scikit-build-core", "meson-python", "maturin",
               "cargo", "node-gyp")  # fmt: skip
"""The builds this module knows; another is named by its build backend."""
COMPILER = ("build-essential", "pkg-config")
RUST = ("cargo", "rustc")
BACKEND_PACKAGES = {"scikit-build-core": ("cmake", "ninja-build"), "meson-python": ("ninja-build",)}
"""Tools the backend runs from the system (meson itself comes from PyPI with meson-python)."""

INCLUDE = re.compile(r"^\s*#\s*include\s*<([\w./+-]+)>", re.MULTILINE)
SETUP_EXTENSION = re.compile(r"\bext_modules\b|\bExtension\(|\bcythonize\(")


@dataclass(frozen=True)
class NativeBuild:
    """What a repository's native build needs."""

    kind: str
    """One of `KNOWN_KINDS`, or the build backend that builds it (`pep517_backend.hooks`)."""
    packages: tuple[str, ...]
    """Debian packages: compiler, headers, toolchain, libraries."""
    build: tuple[str, ...]
    """Commands that rebuild it in the tree (none where the module docstring says why)."""
    build_inputs: tuple[str, ...]
    """Git pathspecs of the files a change to which needs `build`."""
    reason: str
    """Why, for a person: which signs were found."""

    @property
    def in_venv(self) -> bool:
        """Its build requirements go into the venv, and the project installs without build
        isolation (`REBUILT_FROM_THE_VENV`)."""
        return self.kind in REBUILT_FROM_THE_VENV


def python_build(root: Path, pyproject: Mapping[str, Any]) -> NativeBuild | None:
    """The native build of a Python project, or None when it builds none."""
    system = pyproject.get("build-system") or {}
    backend = str(system.get("build-backend") or "")
    requires = " ".join(str(r) for r in system.get("requires") or []).lower()
    setup_py = _read(root / "setup.py")
    sources = native_sources(root)
    headers = native_sources(root, HEADER_SUFFIXES) if sources else []
    suffixes = sorted({path.suffix for path in sources})
    in_setup = bool(SETUP_EXTENSION.search(setup_py))
    in_pyproject = bool(((pyproject.get("tool") or {}).get("setuptools") or {}).get("ext-modules"))
    rust = ".rs" in suffixes or (root / "Cargo.toml").is_file()
    if backend.startswith("maturin"):
        kind, signs = "maturin", "build backend maturin"
    elif backend.startswith("scikit_build_core"):
        kind, signs = "scikit-build-core", "build backend scikit-build-core"
    elif backend == "mesonpy":
        kind, signs = "meson-python", "build backend meson-python"
    elif re.search(r"setuptools[-_]rust", requires) or (rust and "setuptools-rust" in setup_py):
        kind, signs = "setuptools-rust", "build requirement setuptools-rust"
    elif in_setup or in_pyproject:  # an in-tree backend wrapping setuptools runs them too
        kind = "setuptools"
        signs = (
            "setup.py declares extension modules" if in_setup else "[tool.setuptools] ext-modules"
        )
    elif backend not in SETUPTOOLS_BACKENDS and sources:
        kind, signs = backend, f"build backend {backend}, whose rebuild is not known"
    elif sources and not rust:
        kind, signs = "setuptools", "native sources in the package"
    elif rust:
        kind, signs = "cargo", "Cargo.toml"
    else:
        return None
    uses_rust = kind in ("maturin", "setuptools-rust", "cargo")
    libraries = _libraries(sources, headers, setup_py)
    packages = [*COMPILER]
    packages += [] if kind in ("maturin", "cargo") else ["python3-dev"]  # pyo3 needs no headers
    packages += [*RUST] if uses_rust else []
    packages += [*BACKEND_PACKAGES.get(kind, ()), *libraries]
    build: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    if kind == "setuptools":
        build = (
            "python setup.py build_ext --inplace"
            if setup_py
            else 'python -c "from setuptools import setup; setup()" build_ext --inplace',
        )
        inputs = _globs([*suffixes, *sorted({path.suffix for path in headers})]) + tuple(
            name for name in ("setup.py", "pyproject.toml") if (root / name).is_file()
        )
    found = ", ".join(s.lstrip(".") for s in suffixes) or "no sources found"
    said = f"{signs} ({found})" + (f"; libraries: {', '.join(libraries)}" if libraries else "")
    return NativeBuild(kind, tuple(dict.fromkeys(packages)), build, inputs, said)


def node_build(root: Path, manifest: Mapping[str, Any]) -> NativeBuild | None:
    """A Node package's native addon (node-gyp), or None."""
    if not ((root / "binding.gyp").is_file() or manifest.get("gypfile") is True):
        return None
    sources = native_sources(root)
    libraries = _libraries(sources, native_sources(root, HEADER_SUFFIXES), "")
    packages = (*COMPILER, "python3", *libraries)
    return NativeBuild("node-gyp", packages, (), (), "binding.gyp (node-gyp)")


def native_sources(root: Path, suffixes: tuple[str, ...] = NATIVE_SUFFIXES) -> list[Path]:
    """Compiled sources (files ending in `suffixes`) outside hidden folders and `NOT_SHIPPED`
    ones (at most `MAX_WALKED` files looked at; symlinks are not followed)."""
    found: list[Path] = []
    walked = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d.lower() not in NOT_SHIPPED)
        walked += len(files)
        found += [Path(folder, n) for n in sorted(files) if n.endswith(suffixes)]
        if walked >= MAX_WALKED:
            break
    return [path for path in found if path.is_file() and not path.is_symlink()]


def _libraries(sources: list[Path], headers: list[Path], setup_py: str) -> list[str]:
    """Debian packages of the system libraries the build names: headers included with `<…>`
    (in its sources and headers) that the tree does not hold, and `libraries=[…]` in
    setup.py."""
    held = {path.name for path in headers}
    wanted: list[str] = []
    for path in [*sources, *headers][:MAX_READ]:
        for header in INCLUDE.findall(_read(path, READ_BYTES)):
            if header in HEADERS and Path(header).name not in held:
                wanted.append(HEADERS[header])
    for listed in re.findall(r"libraries\s*=\s*\[([^\]]*)\]", setup_py):
        for name in re.findall(r"['\"]([\w+.-]+)['\"]", listed):
            if name in LIBRARIES:
                wanted.append(LIBRARIES[name])
    return sorted(set(wanted))


def _globs(suffixes: list[str]) -> tuple[str, ...]:
    every = [s for suffix in suffixes for s in (suffix, *COMPANIONS.get(suffix, ()))]
    return tuple(f"*{suffix}" for suffix in dict.fromkeys(every))


def _read(path: Path, limit: int = READ_BYTES * 4) -> str:
    if not path.is_file() or path.is_symlink():
        return ""
    with path.open("rb") as handle:
        return handle.read(limit).decode("utf-8", "replace")
