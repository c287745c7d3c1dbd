#!/usr/bin/env bash
# `make lock`: writes requirements.lock, the one list of the Python packages that the venv
# (`make setup`), the service image (`make images`) and CI install: an exact version of each and
# the sha256 of every file of that version on the index, for CPython 3.11 on any platform, with
# an environment marker where a platform or patch release needs something else (Debian's 3.11.2,
# which the images run, needs `async-timeout`; 3.11.3 and later do not).
#
# What it resolves: pyproject.toml with the `dev` extra (which includes `fake`), the build
# backend from its [build-system] (so the project installs without fetching one), and pip.
# Versions already in the lock are kept while pyproject.toml still allows them; `make lock
# UPGRADE=1` takes the newest of everything. uv does the resolving: it is installed into .venv
# here and nowhere else (`make setup` installs only what the lock lists).
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
LOCK=requirements.lock

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/pip install -q "uv==$UV_VERSION"
build_requires=$(.venv/bin/python -c '
import tomllib
with open("pyproject.toml", "rb") as file:
    print("\n".join(tomllib.load(file)["build-system"]["requires"]))')

if [ -n "${UPGRADE:-}" ]; then
  echo "lock: taking the newest version of every package that pyproject.toml allows"
fi
# --system-certs: the index is reached with the system's CA store, as pip reaches it.
printf '%s\npip\n' "$build_requires" | .venv/bin/uv pip compile --quiet pyproject.toml - \
  --extra dev --universal --python-version 3.11 --generate-hashes --system-certs \
  --custom-compile-command "make lock" ${UPGRADE:+--upgrade} --output-file "$LOCK"
echo "lock: $LOCK has $(grep -c '^[a-z0-9]' "$LOCK") pinned packages; \`make setup\` installs them"
