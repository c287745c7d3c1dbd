# `make demo` and `make test` do all set-up themselves on a fresh Debian machine.
.PHONY: setup lock demo demo-plus demo-review unit test bench soak eval docs lint clean images

BIN := .venv/bin

setup:
	@bash scripts/setup.sh

# requirements.lock, resolved from pyproject.toml by uv (scripts/lock.sh): every package `make
# setup`, the images and CI install, pinned with its hashes. Keeps the pins pyproject.toml still
# allows; `make lock UPGRADE=1` takes the newest of everything. Run `make setup` after it.
lock:
	@bash scripts/lock.sh

# The service images for compose.yaml (baton-base, baton:<version>), built without a registry.
images: setup
	bash scripts/with-docker.sh $(BIN)/python -m images.build

demo: setup
	bash scripts/with-docker.sh $(BIN)/baton demo

# fixer-plus, the fixer as a graph, on the same sample: the demo approves the plan's gate,
# search delegates to subagents, three fixes run at once and the proven one is published.
demo-plus: setup
	bash scripts/with-docker.sh $(BIN)/baton demo --pipeline fixer-plus

# The reviewer pipeline on the bundled pull request (demo/pull_request/): the fake Gemini plays
# the reviewer, the fake GitHub receives the review, which is shown at the end.
demo-review: setup
	bash scripts/with-docker.sh $(BIN)/baton demo-review

# The unit tier: no redis-server, no dockerd, no network (tests marked `integration` are left
# out), on both cores; property tests run a fifth of their examples (tests/tiers.py).
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: compiling google-adk and
# google-genai afresh at every start would cost more than the tests. A worker that runs out of
# tests takes some of the other's (worksteal): the slow ones come in runs of a file. A passed
# test's tmp_path is removed as it ends, on its worker; kept, the run three runs back was removed
# at the end, ten thousand files of git repositories in one process (3 s).
unit: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -m "not integration" -n 2 --dist worksteal \
		-o tmp_path_retention_policy=failed --hypothesis-profile=unit \
		--ignore=tests/integration --ignore=tests/deploy

# Everything: lint, then both tiers against real redis-server, Celery workers, dockerd, Chromium
# (scripts/test.sh): the service images build in the background while the unit tier runs on both
# cores (with every property example); then the integration tier, several test processes at once
# (INTEGRATION_WORKERS), each with its own services.
test: lint
	bash scripts/test.sh

bench: setup
	bash scripts/with-docker.sh --runsc $(BIN)/python -m bench

# The long runs `make test` keeps a short version of: the soak at Baton's default settings (60
# runs, workers killed every half minute; the test: 10 runs, 6 kills, fast recovery) and the
# quota governor's storms (the tests: one of each, smaller). `make bench` runs them too; both
# record their results (bench/results/soak.json, governor.json) and draw the docs.
soak: setup
	bash scripts/with-docker.sh $(BIN)/python -m bench soak governor

# The evaluation harness on the corpus of real bugs (eval/corpus): the oracle must resolve every
# instance, the saboteur and the stale reproduction none; records eval/results/eval.json, then
# draws the docs from it.
eval: setup
	bash scripts/with-docker.sh $(BIN)/baton eval eval/corpus --mode oracle --mode saboteur \
		--mode stale --results eval/results/eval.json
	$(BIN)/python -m bench.docs

# The generated sections of README.md and docs/*.md, drawn afresh from bench/results/ and
# eval/results/ (bench/docs.py); `make bench` and `make eval` do it after they record.
docs: setup
	$(BIN)/python -m bench.docs

lint: setup
	$(BIN)/ruff check orchestrator workers sandbox testkit demo images tests bench evaluation
	$(BIN)/ruff format --check orchestrator workers sandbox testkit demo images tests bench evaluation
	$(BIN)/mypy

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache build *.egg-info
