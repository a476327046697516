# The two commands of the README:
#   make run    set up and start the embedded local cluster (foreground, Ctrl-C stops it)
#   make test   set up and run the whole test suite (lint, unit, chart, integration, end-to-end)
.PHONY: run test setup lint unit chart crds monitoring integration e2e bench

setup:
	./.ci/setup

run: setup
	.venv/bin/tidalmq local up --brokers 3

# mypy's cache lives in the build cache (TIDALMQ_CACHE_DIR, else the same default as
# bench/cache.py): CI checks out a fresh clone each time, and a cold mypy takes 60-120 s where a
# warm one takes ~5 s. Sharing it between clones is safe: mypy re-checks every file whose content
# hash differs from the cached one, whatever the path or modification time.
MYPY_CACHE_DIR ?= $(or $(TIDALMQ_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tidalmq)/mypy-cache

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) .venv/bin/mypy
	.venv/bin/lint-imports

unit: setup
	.venv/bin/pytest tests/unit

# The Helm chart: helm lint and helm template checks with the pinned helm (built from the Go module
# proxy into the cache when missing), CRD copies and schemas.
chart: setup
	e2e/cluster/build-tools.sh helm
	.venv/bin/pytest charts/tidalmq/tests

# The chart's Grafana dashboards and Prometheus alerts (charts/tidalmq/monitoring/) are generated
# from observability/: change the code, run this, commit both (a chart test compares them).
monitoring: setup
	.venv/bin/python -m observability.generate

# crds/ is the source of truth; the chart ships identical copies (a chart test checks them).
# The Topic and StaticTopic configs schemas are generated from the broker's table of topic
# configs (tidalmq_core/topics.py TOPIC_CONFIG_DEFS): change the table, run this, commit all.
crds: setup
	.venv/bin/python -m tidalmq_operator.crd_configs
	cp crds/*.yaml charts/tidalmq/crds/

# Integration and end-to-end tests start real servers on a shared 2-core machine: like Apache
# Kafka's own CI (Gradle's test-retry, one retry), a test that fails is run once more and the
# suite fails only if it fails again. Every rerun is reported with its first attempt's failure
# (tests/support/reruns.py: the session's summary and <cache>/logs/reruns.log), to be fixed.
RERUNS = --reruns 1 --reruns-delay 2 -raR

# The integration tests in two worker processes (pytest-xdist): they mostly wait on servers,
# clients and timers, so on the 2-core machine two at a time take ~0.6 of the serial time
# (docs/testing.md, "CI time budget"). Whole files go to a worker (their module-scoped clusters
# start once), in collection order (--no-loadscope-reorder: the kube-apiserver modules stay last,
# tests/conftest.py). `make integration INTEGRATION_WORKERS=` runs them in one process.
INTEGRATION_WORKERS = -n 2 --dist loadfile --no-loadscope-reorder

# Tests marked `alone` (the connection-bound tests: a broker's RSS and latency under thousands of
# loopback connections) run after the others in one process: beside another worker they timed
# out (CI trial of 2026-11-28: 180 s of slow connects, then a rerun on the same broker that got
# no answer buffered).
integration: setup
	.venv/bin/pytest tests/integration --durations=20 -m "not alone" $(INTEGRATION_WORKERS) $(RERUNS)
	.venv/bin/pytest tests/integration --durations=5 -m alone $(RERUNS)

e2e: setup
	.venv/bin/pytest e2e --durations=20 $(RERUNS)

# The whole suite. A background prebuild (.ci/prebuild) builds what integration and e2e need (Go
# tools, MinIO, Kafka jars, the e2e cluster's packages and images) while lint, unit and chart run;
# the tests wait for a build in progress through the build scripts' locks. Its timing is printed
# at the end, pass or fail (or interrupted: the report also stops a prebuild still running).
test:
	@.ci/prebuild start
	@trap '.ci/prebuild report; exit 130' INT TERM; status=0; \
	  $(MAKE) --no-print-directory lint unit chart integration e2e || status=$$?; \
	  .ci/prebuild report; exit $$status
