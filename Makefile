# The two commands of the README:
#   make run    set up and start the embedded local cluster (foreground, Ctrl-C stops it)
#   make test   set up and run the whole test suite (lint, unit, chart, integration, end-to-end)
.PHONY: run test setup lint unit chart crds integration e2e bench

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

# The Helm chart: helm lint and helm template checks with the pinned helm (built from the Go module
# proxy into the cache when missing), CRD copies and schemas.
chart: setup
	e2e/cluster/build-tools.sh helm
	.venv/bin/pytest charts/tidalmq/tests

# crds/ is the source of truth; the chart ships identical copies (a chart test checks them).
crds:
	cp crds/*.yaml charts/tidalmq/crds/

integration: setup
	.venv/bin/pytest tests/integration

e2e: setup
	.venv/bin/pytest e2e

test: lint unit chart integration e2e
