# Two commands on a fresh machine: `make demo` runs the main job, `make test` the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test lint bench protos generate system-deps schema-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Not quiet: the first install downloads JAX and takes about a minute; pip's own lines
# and progress bars show it is working.
$(VENV)/.installed-demo: pyproject.toml exporter/profiles/_xwire.c exporter/profiles/_highwayhash.c exporter/profiles/_treegraphs.c exporter/analysis/facts/_kernel_streams.c | $(BIN)/python
	@echo "make demo: installing mlprof-exporter and JAX into $(VENV) (about a minute the first time)"
	$(BIN)/pip install --progress-bar on -e '.[jax]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml exporter/profiles/_xwire.c exporter/profiles/_highwayhash.c exporter/profiles/_treegraphs.c exporter/analysis/facts/_kernel_streams.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[jax,dev]'
	touch $@ $(VENV)/.installed-demo

demo: $(VENV)/.installed-demo
	$(BIN)/mlprof demo

system-deps:
	scripts/system-deps.sh

# Grafana's published dashboard schema (npm) for tests/unit/test_dashboard_schema.py.
SCHEMA := tests/schema
$(SCHEMA)/node_modules/.installed: $(SCHEMA)/package.json $(SCHEMA)/package-lock.json
	npm ci --prefix $(SCHEMA) --no-audit --no-fund --loglevel=error
	touch $@

schema-deps: system-deps $(SCHEMA)/node_modules/.installed

test: $(VENV)/.installed-dev system-deps schema-deps
	$(BIN)/ruff check exporter tests bench alerts dashboards
	$(BIN)/ruff format --check exporter tests bench alerts dashboards
	$(BIN)/mypy
	$(BIN)/lint-imports
	@# pytest exits 5 when it collected nothing: that is a failure, not a pass.
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$rc

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check exporter tests bench alerts dashboards
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(VENV)/.installed-dev
	# bench/*_workload.py are the processes a benchmark starts, not benchmarks.
	for b in $(filter-out %_workload.py,$(wildcard bench/*.py)); do $(BIN)/python $$b --quick || exit 1; done

protos: $(VENV)/.installed-dev
	scripts/gen-protos.sh

# Rendered rules and dashboards are committed; tests fail when they are stale.
generate: $(VENV)/.installed-dev
	$(BIN)/python -m alerts.render
	$(BIN)/python -m alerts.recording
	$(BIN)/python -m alerts.recording --prometheus-rule mlprof-recording -o deploy/k8s/prometheusrule-recording.yaml
	$(BIN)/python -m dashboards.generate

clean:
	rm -rf $(VENV) mlprof-data .pytest_cache .mypy_cache .ruff_cache $(SCHEMA)/node_modules
