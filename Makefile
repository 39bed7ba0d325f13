# replaylab: `make run` trains the demand model and the router on the embedded default data;
# `make test` runs every test.
# Both create .venv when absent and install the pinned environment (torch CPU first).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.replaylab-installed
RUN_DIR ?= outputs/make-run

.PHONY: setup run test test-fast test-haswell bench lint clean chromium postgresql native golang

CHROMIUM ?= /usr/bin/chromium

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# An unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel on this disk.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP) native

# The Rust crate's release build when cargo is present (the replaylab-route CLI and the C ABI
# library libreplaylab_scorer.so / .a that replaylab.runtime.native, C and Go hosts load);
# without cargo the pure Python runtime serves and the Rust, C and Go tests skip.
CARGO ?= $(or $(shell command -v cargo 2>/dev/null),$(wildcard $(HOME)/.cargo/bin/cargo))
native:
	@if [ -n "$(CARGO)" ]; then cd scorers/rust && PATH="$(dir $(CARGO)):$$PATH" $(CARGO) build --offline --release --quiet \
	  || echo "warning: the Rust crate did not build; Python serves without the native library"; \
	else echo "note: no cargo: the native library is not built (the pure Python runtime serves)"; fi

# Go for the Go host's test (scorers/go; Debian's golang-go, as chromium below).
golang:
	@command -v go >/dev/null || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q golang-go || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q golang-go; } \
	  || echo "warning: could not install golang-go; the Go host test will skip"; }

# Headless Chromium for the report tests (Debian's package; ~40 s the first time).
chromium:
	@test -x $(CHROMIUM) || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q chromium || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; } \
	  || echo "warning: could not install chromium; the browser report test will skip"; }

# PostgreSQL server binaries (Debian's package) for the Router Replay store test, which
# starts its own server on loopback in a temporary folder.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q postgresql || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q postgresql; } \
	  || echo "warning: could not install postgresql; the Router Replay PostgreSQL tests will skip"; }

run: setup
	$(PY) -m training pipeline=demand hydra.run.dir=$(RUN_DIR)/demand
	$(PY) -m training pipeline=router hydra.run.dir=$(RUN_DIR)/router
	@echo "demand: $(RUN_DIR)/demand/summary.json  report: $(RUN_DIR)/demand/demand_report.html"
	@echo "router: $(RUN_DIR)/router/summary.json  report: $(RUN_DIR)/router/router_report.html"

# Tests of importers on the full public files read $REPLAYLAB_SHARED_DATA, set here to
# ../shared/data when that folder is beside the checkout (a value in the environment wins);
# without it they skip, counted at the end of the run.
SHARED_DATA := $(or $(REPLAYLAB_SHARED_DATA),$(wildcard $(abspath ../shared/data)))
# The suite on both cores (pytest-xdist): one test file runs whole on one worker, the longest
# files first (tests/conftest.py, docs/howto/testing.md); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup chromium postgresql golang
	$(if $(SHARED_DATA),REPLAYLAB_SHARED_DATA=$(SHARED_DATA)) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

test-fast: setup chromium postgresql golang
	$(if $(SHARED_DATA),REPLAYLAB_SHARED_DATA=$(SHARED_DATA)) $(PY) -m pytest -q -m "not slow"

# The golden-vector, int8, fixture and Rust tests on an emulated AVX2-only CPU (no AVX-512,
# no VNNI): qemu-user's Haswell (Debian: apt-get install qemu-user), less the features qemu's
# TCG lacks anyway (it warns about each: TSX, pcid, x2apic, ...). Figures and why:
# docs/results/int8-cpus.md "make test-haswell". First it checks that the emulated CPU is
# the AVX2 one (numpy finds no AVX-512, the int8 probe saturates); /proc/cpuinfo under
# qemu-user is the host's. NPY_DISABLE_CPU_FEATURES: numpy's AVX2 (X86_V3) float64 argsort
# segfaults under qemu 7.2's TCG (pandas' groupby quantile calls it), numpy's baseline
# loops run instead; onnxruntime, torch, MKL and OpenBLAS keep their AVX2 kernels.
# REPLAYLAB_EMULATOR: the tests start their Python children through it too.
QEMU ?= qemu-x86_64
HASWELL = $(QEMU) -cpu Haswell,-pcid,-tsc-deadline,-x2apic,-hle,-invpcid,-rtm
HASWELL_TESTS ?= tests/contracts/test_golden.py tests/scorers/test_rust_crate.py \
	tests/scorers/test_rust_demand.py tests/runtime/test_runtime_demand.py \
	tests/artifacts/test_onnx_export.py
HASWELL_PYTEST_ARGS ?= -m "not slow"

test-haswell: setup
	@command -v $(QEMU) >/dev/null || { echo "test-haswell: $(QEMU) not found (apt-get install qemu-user)"; exit 2; }
	$(HASWELL) $(PY) -c "from numpy._core._multiarray_umath import __cpu_features__ as f; \
	from replaylab.contracts.golden import int8_kernel_probe as p; r = p(); \
	print('emulated CPU: avx2', f['AVX2'], 'avx512f', f['AVX512F'], 'int8 probe', r); \
	assert f['AVX2'] and not f['AVX512F'] and r['u8s8_saturates'], 'not an AVX2-only CPU'"
	NPY_DISABLE_CPU_FEATURES=X86_V3 HF_HUB_OFFLINE=1 REPLAYLAB_EMULATOR="$(HASWELL)" \
	  $(HASWELL) $(PY) -m pytest -q -p no:cacheprovider $(HASWELL_PYTEST_ARGS) $(HASWELL_TESTS)
	cd scorers/rust && CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$(HASWELL)" cargo test --offline

bench: setup golang
	$(PY) bench/run_all.py --out bench/results.json

lint: setup
	$(PY) -m ruff check src training export evaluation tests bench scripts

clean:
	rm -rf outputs multirun mlflow.db mlruns mlartifacts bench/results.json
