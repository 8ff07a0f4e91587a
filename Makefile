# rollnet developer entry points. Every target installs what it needs into .venv first.
#   make demo   - the main job: a local swarm on this machine
#   make test   - the test suite (what CI runs)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev demo test lint codegen check-codegen clean sandbox-tools

$(STAMP): requirements/dev.txt sdk/pyproject.toml sdk/hatch_build.py sdk/src/rollnet/sdk/proofs/_field_kernel.c \
		ledger/pyproject.toml reference/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, from the pinned CPU build, so nothing later pulls a CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -r requirements/dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e sdk -e ledger -e reference
	touch $(STAMP)

dev: $(STAMP) sandbox-tools

# The sandbox for untrusted environment code (rollnet.reference.envs.isolation) needs
# bubblewrap. Installed here when missing and this is root on Debian (as CI is); otherwise a
# warning: verifiers and code tasks are then refused, and their tests skipped (failed in CI).
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
	else \
		echo "warning: bubblewrap (bwrap) is not installed: untrusted environment code" \
			"cannot be sandboxed (Debian: sudo apt-get install bubblewrap)" >&2; \
	fi

demo: $(STAMP)
	$(BIN)/rollnet demo --data-dir .data/demo

test: $(STAMP) sandbox-tools
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy sdk/src ledger/src reference/src scripts

codegen: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/buf generate 2>/dev/null

check-codegen: codegen
	git diff --exit-code -- sdk/src/rollnet/v1
	test -z "$$(git status --porcelain -- sdk/src/rollnet/v1)"

clean:
	rm -rf $(VENV) .data
