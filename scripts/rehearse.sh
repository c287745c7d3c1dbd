#!/usr/bin/env bash
# What CI meets on a new machine, rehearsed here: a fresh clone of COMMIT (default HEAD) into a
# new folder, a dockerd with an empty data root (no image built before), empty pip, npm and
# test caches; then `bash .ci/run` in it, timed. Apt packages already installed stay installed.
#
#   scripts/rehearse.sh [COMMIT]
#
# No dockerd may be running (the rehearsal starts its own); everything it made is removed at
# the end, but for its log, whose path it prints.
set -uo pipefail
cd "$(dirname "$0")/.."

commit=$(git rev-parse "${1:-HEAD}") || exit 1
if docker info >/dev/null 2>&1; then
  echo "rehearse: a dockerd is running; stop it first (kill \$(pidof dockerd)): the rehearsal" \
    "starts one with an empty data root" >&2
  exit 1
fi
work=$(mktemp -d -t baton-rehearsal.XXXXXX)
log="$work.log"
echo "rehearse: ${commit:0:12} in $work; its output: $log"
git clone --quiet --no-hardlinks "$PWD" "$work/baton" && git -C "$work/baton" checkout --quiet "$commit" || exit 1
started=$(date +%s)
(
  cd "$work/baton"
  export BATON_DOCKER_DATA_ROOT="$work/docker" \
    PIP_CACHE_DIR="$work/cache/pip" npm_config_cache="$work/cache/npm" XDG_CACHE_HOME="$work/cache"
  bash .ci/run
) >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - started))
tail -n 25 "$log"
printf 'rehearse: %s exited %s after %d min %02d s\n' "${commit:0:12}" "$status" $((elapsed / 60)) $((elapsed % 60))
# The data root's layers are mounted while dockerd runs; .ci/run stopped the dockerd it started.
rm -rf "$work"
exit "$status"
