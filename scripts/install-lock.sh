#!/usr/bin/env bash
# Installs requirements.lock, exactly, into the environment of PYTHON:
#
#   scripts/install-lock.sh PYTHON [LOCK]
#
# pip takes each locked file, checked against its hash, and nothing else (--no-deps): pip does
# not resolve, so no package's requirement can pull in a release newer than the lock, whatever
# the index offers that day. Then `pip check` and `python -m images.lock verify` hold the
# result to the lock: every package at its locked version, and every requirement of every
# installed package (their extras included) met by what the lock installed. A lock that leaves
# one out fails here, by name, not at an import much later.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${1:?usage: scripts/install-lock.sh PYTHON [LOCK]}
lock=${2:-requirements.lock}

# -qq: errors only (this machine's pip configuration names find-links folders that may not
# exist, and pip warns of each one of them for every package)
"$python" -m pip install -qq --no-deps --require-hashes -r "$lock"
checked=0
"$python" -m pip check || checked=1
# images.lock is read by the python that runs this checkout's code (VERIFY_PYTHON), looking at
# the site-packages of the one installed into.
site=$("$python" -c 'import site; print("\n".join(site.getsitepackages()))')
mapfile -t sites <<<"$site"
"${VERIFY_PYTHON:-$python}" -m images.lock verify --lock "$lock" "${sites[@]}" || checked=1
exit "$checked"
