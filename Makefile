# replaylab: `make run` trains the demand model and the router on the embedded default data;
# `make test` runs every test.
# Both create .venv when absent and install the pinned environment (torch CPU first).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.replaylab-installed
RUN_DIR ?= outputs/make-run

.PHONY: setup run test test-fast bench lint clean chromium

CHROMIUM ?= /usr/bin/chromium

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# An unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel on this disk.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)

# Headless Chromium for the report tests (Debian's package; ~40 s the first time).
chromium:
	@test -x $(CHROMIUM) || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q chromium || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; } \
	  || echo "warning: could not install chromium; the browser report test will skip"; }

run: setup
	$(PY) -m training pipeline=demand hydra.run.dir=$(RUN_DIR)/demand
	$(PY) -m training pipeline=router hydra.run.dir=$(RUN_DIR)/router
	@echo "demand: $(RUN_DIR)/demand/summary.json  report: $(RUN_DIR)/demand/demand_report.html"
	@echo "router: $(RUN_DIR)/router/summary.json  report: $(RUN_DIR)/router/router_report.html"

# Tests of importers on the full public files read $REPLAYLAB_SHARED_DATA, set here to
# ../shared/data when that folder is beside the checkout (a value in the environment wins);
# without it they skip, counted at the end of the run.
SHARED_DATA := $(or $(REPLAYLAB_SHARED_DATA),$(wildcard $(abspath ../shared/data)))
test: setup chromium
	$(if $(SHARED_DATA),REPLAYLAB_SHARED_DATA=$(SHARED_DATA)) $(PY) -m pytest -q

test-fast: setup chromium
	$(if $(SHARED_DATA),REPLAYLAB_SHARED_DATA=$(SHARED_DATA)) $(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) bench/run_all.py --out bench/results.json

lint: setup
	$(PY) -m ruff check src training export evaluation tests bench scripts

clean:
	rm -rf outputs multirun mlflow.db mlruns mlartifacts bench/results.json
