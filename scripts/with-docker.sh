#!/usr/bin/env bash
# Runs a command with a Docker daemon and Baton's sandbox image available: starts dockerd when
# none answers (and stops it afterwards), builds the image when it is missing.
set -uo pipefail
cd "$(dirname "$0")/.."

started=""
if ! docker info >/dev/null 2>&1; then
  echo "with-docker: starting dockerd"
  log=$(mktemp -t baton-dockerd.XXXXXX.log)
  dockerd >"$log" 2>&1 &
  started=$!
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    echo "with-docker: dockerd did not start; its log:" >&2
    tail -n 30 "$log" >&2
    kill "$started" 2>/dev/null
    exit 1
  fi
fi

stop_dockerd() {
  if [ -n "$started" ]; then
    echo "with-docker: stopping the dockerd it started"
    kill "$started" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$started" 2>/dev/null || break; sleep 0.5; done
  fi
}
trap stop_dockerd EXIT

.venv/bin/python -m sandbox.image || exit 1
"$@"
