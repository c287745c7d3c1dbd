#!/usr/bin/env bash
# Runs a command with a Docker daemon and Baton's sandbox image available: starts dockerd when
# none answers (and stops it afterwards), with gVisor's runsc registered as the `runsc` runtime
# the sandbox tests also run on (docs/sandboxes.md, "Sandbox hosts"); builds the image when it
# is missing.
#
#   scripts/with-docker.sh [--runsc] COMMAND...
#
# --runsc: COMMAND needs the runsc runtime (the tests do; the demo does not). A dockerd already
# running without it, as Baton registers it, stops this at once with the one-line fix, rather
# than failing the sandbox tests on runsc much later.
#
# BATON_DOCKER_DATA_ROOT=DIR: the dockerd started here keeps its images and containers in DIR
# (`dockerd --data-root`), e.g. an empty folder, to run as a new machine would, with no image
# built before (scripts/rehearse.sh does). A dockerd already running with another data root
# stops this at once.
set -uo pipefail
cd "$(dirname "$0")/.."

need_runsc=""
if [ "${1:-}" = "--runsc" ]; then
  need_runsc=1
  shift
fi

# What to add to daemon.json's "runtimes". --network=none: Debian's runsc (20221219) mistakes a
# container's network namespace for the host's on Linux >= 6.x and refuses to start
# (gvisor#10704); sandboxes have no network anyway. --host-uds=open: an environment build's
# container, which has no network either, reaches the package registries through the egress
# proxy's unix socket bound into it (docs/security.md); gVisor refuses host sockets otherwise.
runsc=$(command -v runsc || echo /usr/bin/runsc)
RUNSC_JSON="{\"runsc\": {\"path\": \"$runsc\", \"runtimeArgs\": [\"--network=none\", \"--host-uds=open\"]}}"

# /etc/docker/daemon.json (if any) with the runsc runtime added, written to $1.
daemon_config() {
  .venv/bin/python -c '
import json, pathlib, sys
base = pathlib.Path("/etc/docker/daemon.json")
config = json.loads(base.read_text()) if base.exists() else {}
config.setdefault("runtimes", {}).update(json.loads(sys.argv[2]))
pathlib.Path(sys.argv[1]).write_text(json.dumps(config, indent=2))
' "$1" "$RUNSC_JSON"
}

started=""
conf=""
if [ -n "${BATON_DOCKER_DATA_ROOT:-}" ] && docker info >/dev/null 2>&1; then
  running=$(docker info --format '{{.DockerRootDir}}')
  if [ "$running" != "$BATON_DOCKER_DATA_ROOT" ]; then
    echo "with-docker: a dockerd already runs with its data in $running, not" \
      "BATON_DOCKER_DATA_ROOT=$BATON_DOCKER_DATA_ROOT: stop it first (kill \$(pidof dockerd))" >&2
    exit 1
  fi
fi
if ! docker info >/dev/null 2>&1; then
  echo "with-docker: starting dockerd${BATON_DOCKER_DATA_ROOT:+ with its data in $BATON_DOCKER_DATA_ROOT}"
  log=$(mktemp -t baton-dockerd.XXXXXX.log)
  config=()
  if [ -n "${BATON_DOCKER_DATA_ROOT:-}" ]; then
    mkdir -p "$BATON_DOCKER_DATA_ROOT"
    config+=(--data-root "$BATON_DOCKER_DATA_ROOT")
  fi
  if command -v runsc >/dev/null; then
    conf=$(mktemp -t baton-dockerd.XXXXXX.json)
    daemon_config "$conf" && config+=(--config-file "$conf")
  elif [ -n "$need_runsc" ]; then
    echo "with-docker: runsc is not installed: run scripts/setup.sh (it installs it)" >&2
    exit 1
  fi
  dockerd "${config[@]}" >"$log" 2>&1 &
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
  [ -z "$conf" ] || rm -f "$conf"
}
trap stop_dockerd EXIT

if [ -n "$need_runsc" ] && ! docker info --format '{{json .Runtimes}}' 2>/dev/null \
    | grep -q '"runsc":{[^}]*"--host-uds=open"'; then
  echo "with-docker: the running dockerd has no runsc runtime registered as Baton needs it" \
    "(the sandbox tests run on it). Fix: add to /etc/docker/daemon.json" \
    "{\"runtimes\": $RUNSC_JSON}, then kill -HUP \$(pidof dockerd)" >&2
  exit 1
fi

.venv/bin/python -m sandbox.image || exit 1
"$@"
