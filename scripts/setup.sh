#!/usr/bin/env bash
# Installs what Baton needs on a fresh Debian machine: system packages (when missing) and the
# project's virtualenv. Safe to run again; it does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v git >/dev/null || need+=(git)
command -v rg >/dev/null || need+=(ripgrep)
command -v dockerd >/dev/null || need+=(docker.io)
command -v runsc >/dev/null || need+=(runsc)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v ip >/dev/null || need+=(iproute2) # the egress test's own network namespace
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian's packages may start system services; Baton starts its own where it needs them.
  if command -v service >/dev/null; then
    [[ " ${need[*]} " == *" redis-server "* ]] && { service redis-server stop >/dev/null 2>&1 || true; }
  fi
fi

# Python packages: exactly what requirements.lock lists (`make lock` writes it), each file checked
# against its hash, nothing resolved against the index, then Baton itself, editable, with no
# dependency of its own and the locked setuptools as its build backend. .venv/.installed holds the hashes of the lock and of
# pyproject.toml it was made from: a changed lock makes .venv afresh (so nothing the lock no
# longer lists stays behind), a changed pyproject.toml reinstalls Baton.
lock_sum="lock $(sha256sum requirements.lock | cut -d' ' -f1)"
project_sum="project $(sha256sum pyproject.toml | cut -d' ' -f1)"
installed=()
if [ -f .venv/.installed ]; then
  mapfile -t installed < .venv/.installed
fi
if [ "${installed[0]:-}" != "$lock_sum" ]; then
  if [ -e .venv ]; then
    echo "setup: requirements.lock is not what .venv was made from: making .venv afresh"
    rm -rf .venv
  fi
  echo "setup: creating .venv from requirements.lock"
  "${PYTHON:-python3}" -m venv .venv
  # Exactly the lock, never what the index offers that day (scripts/install-lock.sh).
  bash scripts/install-lock.sh .venv/bin/python requirements.lock
fi
if [ "${installed[0]:-}" != "$lock_sum" ] || [ "${installed[1]:-}" != "$project_sum" ]; then
  echo "setup: installing Baton into .venv"
  # An older setup built Baton's metadata here; run from this folder, Python would read its
  # stale entry points (the pipelines, the commands) before the installed ones.
  rm -rf baton.egg-info
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  printf '%s\n%s\n' "$lock_sum" "$project_sum" > .venv/.installed
fi
