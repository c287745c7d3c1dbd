#!/usr/bin/env bash
# `make test` after lint: both tiers against real services, inside scripts/with-docker.sh (which
# starts dockerd with runsc registered when none runs, and builds the sandbox image).
#
# 1. The service images for the Compose tests (`python -m images.build`: a debootstrapped base,
#    the locked wheels, `docker build`) start building in the background, with their progress in
#    build/images.log, so no test builds an image inside its timeout.
# 2. The unit tier, on both cores, with every property example.
# 3. The images' build is waited for; a failure stops here with its log's end.
# 4. The integration tier, INTEGRATION_WORKERS test processes at once (default 3), a file's tests
#    kept together in one process (--dist loadfile): each process has its own redis-server,
#    workers and fake servers (tests/conftest.py), the tests of a file share them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${BATON_TEST_DOCKER:-}" ]; then
  BATON_TEST_DOCKER=1 exec bash scripts/with-docker.sh --runsc bash "$0" "$@"
fi

BIN=.venv/bin
mkdir -p build
echo "test: building the service images in the background (progress: build/images.log)"
"$BIN/python" -m images.build >build/images.log 2>&1 &
images=$!

echo "test: the unit tier"
unit=0
env -u PYTHONDONTWRITEBYTECODE "$BIN/pytest" -q -m "not integration" -n 2 --dist worksteal \
  -o tmp_path_retention_policy=failed --ignore=tests/integration --ignore=tests/deploy || unit=$?

echo "test: waiting for the service images"
if ! wait "$images"; then
  echo "test: building the service images failed; the end of build/images.log:" >&2
  tail -n 40 build/images.log >&2
  exit 1
fi
tail -n 1 build/images.log
[ "$unit" -eq 0 ] || { echo "test: the unit tier failed" >&2; exit "$unit"; }

echo "test: the integration tier, ${INTEGRATION_WORKERS:-3} test processes at once"
exec env -u PYTHONDONTWRITEBYTECODE "$BIN/pytest" -q -m integration \
  -n "${INTEGRATION_WORKERS:-3}" --dist loadfile --durations=15
