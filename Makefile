# The two commands of the README:
#   make run    set up and start the embedded local cluster (foreground, Ctrl-C stops it)
#   make test   set up and run the whole test suite (lint, unit, integration, end-to-end)
.PHONY: run test setup lint unit integration e2e bench

setup:
	./.ci/setup

run: setup
	.venv/bin/tidalmq local up --brokers 3

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

unit: setup
	.venv/bin/pytest tests/unit

integration: setup
	.venv/bin/pytest tests/integration

e2e: setup
	.venv/bin/pytest e2e

test: lint unit integration e2e
