# rollnet developer entry points. Every target installs what it needs into .venv first.
# `make help` lists them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where pip takes torch from. Empty: PyPI, which works everywhere. On a machine without a GPU,
# `make dev-cpu` (or TORCH_INDEX=https://download.pytorch.org/whl/cpu) takes the CPU-only build
# instead of PyPI's Linux wheel, which pulls in the CUDA libraries (several GB).
TORCH_INDEX ?=
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
# The browser the dashboard's tests drive (Debian's package; playwright's own download is not used).
CHROMIUM ?= /usr/bin/chromium
# Test processes `make test` runs side by side (pytest-xdist). Much of the suite waits on servers
# and deadlines, so two processes finish it in about two thirds of the time even on two cores.
TEST_WORKERS ?= 2
# The plain HTTP cache put in front of a relay origin in the broadcast tests (Debian's nginx).
NGINX ?= /usr/sbin/nginx

.PHONY: help dev dev-cpu browser sandbox-tools http-cache demo test test-fast bench lint codegen check-codegen screenshot clean

help: ## list the targets
	@echo "rollnet: make TARGET"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 18
	@echo "After 'make dev', run commands as .venv/bin/rollnet ... or 'source .venv/bin/activate' first."

$(STAMP): requirements/dev.txt sdk/pyproject.toml sdk/hatch_build.py sdk/src/rollnet/sdk/proofs/_field_kernel.c \
		ledger/pyproject.toml reference/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned, so nothing later pulls another build.
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -r requirements/dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e sdk -e ledger -e reference
	touch $(STAMP)

dev: $(STAMP) browser sandbox-tools http-cache ## install everything into .venv (torch from PyPI)

# The sandbox for untrusted environment code (rollnet.reference.envs.isolation) needs
# bubblewrap. Installed here when missing and this is root on Debian (as CI is); otherwise a
# warning: verifiers and code tasks are then refused, and their tests skipped (failed in CI).
sandbox-tools: ## install Debian's bubblewrap for the environment sandbox, when missing
	@command -v bwrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
	else \
		echo "warning: bubblewrap (bwrap) is not installed: untrusted environment code" \
			"cannot be sandboxed (Debian: sudo apt-get install bubblewrap)" >&2; \
	fi

dev-cpu: ## like dev, with torch's CPU-only build (no CUDA download)
	$(MAKE) dev TORCH_INDEX=$(CPU_TORCH_INDEX)

browser: ## install Debian's chromium for the dashboard's browser tests, when missing
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (the dashboard's browser tests drive it)"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	else \
		echo "warning: no $(CHROMIUM); the dashboard's browser tests will be skipped" \
		     "(install Debian's chromium package)"; \
	fi

http-cache: ## install Debian's nginx for the broadcast tests' HTTP cache, when missing
	@if [ -x "$(NGINX)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing nginx-light (the broadcast tests put it in front of a relay origin)"; \
		(apt-get install -y -q nginx-light >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q nginx-light >/dev/null)); \
	else \
		echo "warning: no $(NGINX); the broadcast tests through an HTTP cache will be skipped" \
		     "(install Debian's nginx-light package)"; \
	fi

demo: $(STAMP) ## the main job: a local swarm on this machine
	$(BIN)/rollnet demo --data-dir .data/demo

test: $(STAMP) browser sandbox-tools http-cache ## the test suite (what CI runs)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=25

test-fast: $(STAMP) ## the edit-test loop: everything but the slow and PostgreSQL tests
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow and not postgres"

# Options for `make bench`, passed to scripts/bench_report.py: --only NAME..., --skip NAME...,
# --set NAME="ARGS" (a benchmark's own arguments), --timeout S, --output PATH, --update (keep
# the report's other benchmarks).
BENCH_ARGS ?=

bench: $(STAMP) ## every benchmark of bench/ (about 40 min), one report: docs/bench/latest.md
	$(BIN)/python scripts/bench_report.py $(BENCH_ARGS)

lint: $(STAMP) ## ruff, ruff format --check, mypy --strict, the import contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy sdk/src ledger/src reference/src scripts examples bench tests
	$(BIN)/lint-imports --no-cache

codegen: $(STAMP) ## regenerate sdk/src/rollnet/v1 and the SDK's unary client methods from protos/
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/buf generate 2>/dev/null

check-codegen: codegen ## fail when the generated code differs from protos/
	git diff --exit-code -- sdk/src/rollnet/v1 sdk/src/rollnet/sdk/_client_generated.py
	test -z "$$(git status --porcelain -- sdk/src/rollnet/v1 sdk/src/rollnet/sdk/_client_generated.py)"

screenshot: $(STAMP) browser ## re-make docs/dashboard.png (the README's screenshot)
	$(BIN)/python scripts/dashboard_screenshot.py docs/dashboard.png

clean: ## remove .venv and .data
	rm -rf $(VENV) .data
