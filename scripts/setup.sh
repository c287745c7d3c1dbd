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

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "${PYTHON:-python3}" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev]'
  touch .venv/.installed
fi
