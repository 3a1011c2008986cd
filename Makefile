# trainmon — every target does its own set-up in a local virtualenv.
#   make run     install and start the node daemon with its built-in defaults
#   make demo    the same over a simulated 8-GPU node with two training jobs; its runs go to
#                demo-ledger.sqlite3 beside your ledger (the start log says how to read them)
#   make test    install everything the suite needs (pip + Debian packages) and run it
#   make test-quick  the inner loop (< 2 min): every test not marked integration, i.e. that
#                needs no engine, no torch.distributed job and no network namespace
#   make lint    ruff, mypy, and a check that every generated file is up to date
#   make generate  regenerate the dashboards (dashboards/*/*.json), the alert rules
#                (alerts/*/trainmon.rules.yml), the PrometheusRules (deploy/kubernetes)
#                and the sharded vmagent configs (deploy/scale)
#   make stack   trainmon --demo, Prometheus and Alertmanager on loopback (docs/deploy.md)
#   make bench   every benchmark that runs without a GPU, then its headline figures side by
#                side with their goals (bash bench/gpu_check.sh runs the rest)
#   make dist    a wheel and an sdist in dist/ (python -m build), e.g. for training images

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
DEBIAN_PACKAGES := prometheus prometheus-alertmanager prometheus-node-exporter \
	prometheus-pushgateway gcc libc6-dev systemd docker-compose victoria-metrics tmux
PYTEST_ARGS ?=
# Most long tests wait on Prometheus/vmalert evaluation clocks or on training
# processes, not on the CPU: four workers on two cores; each test file stays on one
# worker (its module fixtures, an engine it starts, are shared by its tests).
TEST_WORKERS ?= 4
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: run demo test test-quick lint bench clean debian-packages generate stack dist

# The daemon runs as the systemd unit runs it: its Environment= (PYTHONOPTIMIZE=2 and
# MALLOC_ARENA_MAX=1: docs/benchmarks.md, "Resident memory of the node daemon"), with the
# -OO bytecode compiled at install (python -m trainmon.bytecode).
UNIT_ENVIRONMENT := $(shell sed -n 's/^Environment=//p' deploy/systemd/trainmon.service)

$(BIN)/trainmon: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	$(BIN)/python -m trainmon.bytecode
	touch $@

$(VENV)/.test-installed: $(BIN)/trainmon pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/trainmon
	exec env $(UNIT_ENVIRONMENT) $(BIN)/trainmon serve $(ARGS)

demo: $(BIN)/trainmon
	exec env $(UNIT_ENVIRONMENT) $(BIN)/trainmon serve --demo $(ARGS)

debian-packages:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The tests marked quiet assert on timing that a loaded machine breaks (a 10 % slowdown
# named within a minute): they run after the rest, one at a time, with the machine to
# themselves.
# --durations: the slowest tests in CI's log, where the suite's time goes.
test: debian-packages $(VENV)/.test-installed
	$(BIN)/pytest $(PARALLEL) -m "not quiet" --durations=30 $(PYTEST_ARGS)
	$(BIN)/pytest -p no:xdist -m quiet --durations=15 $(PYTEST_ARGS)

test-quick: $(VENV)/.test-installed
	$(BIN)/pytest $(PARALLEL) -m "not integration" $(PYTEST_ARGS)

# The PrometheusRules copy alerts/*/trainmon.rules.yml: generate the rules first.
generate: $(VENV)/.test-installed
	$(BIN)/python -m dashboards
	$(BIN)/python alerts/generate.py
	$(BIN)/python -m deploy.prometheusrule
	$(BIN)/python -m deploy.sharding

lint: $(VENV)/.test-installed
	$(BIN)/ruff check exporter tests testkit bench dashboards deploy alerts
	$(BIN)/mypy
	$(BIN)/mypy --python-version 3.11 dashboards deploy alerts/generate.py alerts/retarget_receivers.py
	$(BIN)/python -m dashboards --check
	$(BIN)/python alerts/generate.py --check
	$(BIN)/python -m deploy.prometheusrule --check
	$(BIN)/python -m deploy.sharding --check

# Every benchmark in turn; node_exporter parity as issue 25 measures it, the fleet one
# engine per run (combined by --report-from); then the headline figures side by side
# (bench/headline.py), each against its anchor and goal. Results in $(BENCH_RESULTS)/.
BENCH_RESULTS ?= bench/results
bench: $(VENV)/.test-installed debian-packages
	@mkdir -p $(BENCH_RESULTS) && rm -f $(BENCH_RESULTS)/headline.jsonl
	@export TRAINMON_BENCH_RESULTS=$(abspath $(BENCH_RESULTS))/headline.jsonl; \
	for script in bench/*.py; do \
		name=$$(basename $$script .py); \
		case $$name in __init__|benchlib|headline|fleet_sim|fleet_scale|node_scrape|gpu_baseline_exporter|gpm_check|nvml_call_cost|diagnosis_score) continue;; esac; \
		echo "== python -m bench.$$name"; $(BIN)/python -m bench.$$name || exit 1; \
	done; \
	echo "== python -m bench.diagnosis_score (the whole labelled suite, about 50 min)"; \
	$(BIN)/python -m bench.diagnosis_score --json $(BENCH_RESULTS)/diagnosis_score.json || exit 1; \
	echo "== python -m bench.node_scrape --collectors default --scrapes 1200"; \
	$(BIN)/python -m bench.node_scrape --collectors default --scrapes 1200 || exit 1; \
	for engine in prometheus victoriametrics; do \
		echo "== python -m bench.fleet_scale --engines $$engine"; \
		$(BIN)/python -m bench.fleet_scale --engines $$engine \
			--json $(BENCH_RESULTS)/fleet-$$engine.json || exit 1; \
	done; \
	$(BIN)/python -m bench.fleet_scale --output $(BENCH_RESULTS)/fleet.md --report-from \
		$(BENCH_RESULTS)/fleet-prometheus.json $(BENCH_RESULTS)/fleet-victoriametrics.json; \
	echo "== headline figures ($(BENCH_RESULTS)/headline.jsonl)"; \
	$(BIN)/python -m bench.headline $$TRAINMON_BENCH_RESULTS

# The wheel carries the client too: `pip install --no-deps dist/trainmon-*.whl` in a training
# image skips the daemon's dependencies, which trainmon.client does not need (README.md).
dist: $(BIN)/trainmon
	$(BIN)/pip install --quiet build
	rm -f dist/trainmon-*.whl dist/trainmon-*.tar.gz
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

stack: $(BIN)/trainmon
	@$(MAKE) --no-print-directory debian-packages DEBIAN_PACKAGES="prometheus prometheus-alertmanager"
	exec $(BIN)/python -m deploy.stack $(ARGS)
