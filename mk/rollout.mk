# Rollout to the PCIe and NVLink fleets (ansible/, rollout/, docs/rollout.md).
#   make deploy   HOST=<host|group> IMAGE=<registry>/<name>:<tag> [INVENTORY=dir] [CHECK=1] [GATE_CONFIG=f]
#   make rollback HOST=...   make status HOST=...   make promote IMAGE=... REPORT=<gate report dir>
.PHONY: deploy rollback status promote render lint-ansible bench-rollout test-rollout cpu-image

HOST ?=
IMAGE ?=
INVENTORY ?= ansible/inventories/example
ROLLOUT_CONFIG ?=
GATE_CONFIG ?=
CHECK ?=
REPORT ?=
ROLLOUT_ARGS = --hosts "$(HOST)" --inventory "$(INVENTORY)" $(if $(ROLLOUT_CONFIG),--config "$(ROLLOUT_CONFIG)")
ROLLOUT_ENV = ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/.cache/ansible-collections

deploy: ## rollout: deploy IMAGE to HOST (host or group), gate each endpoint, promote or roll back [CHECK=1]
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m rollout deploy $(ROLLOUT_ARGS) --image "$(IMAGE)"$(if $(CHECK), --check)$(if $(GATE_CONFIG), --gate-config "$(GATE_CONFIG)")

rollback: ## rollout: put HOST back on its recorded previous image [CHECK=1]
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m rollout rollback $(ROLLOUT_ARGS) $(if $(CHECK),--check)

status: ## rollout: current/previous image, container and health of HOST
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m rollout status $(ROLLOUT_ARGS)

render: ## rollout: show the server container each host of HOST would run (no connection)
	$(ROLLOUT_ENV) $(PY) -m rollout render $(ROLLOUT_ARGS) $(if $(IMAGE),--image "$(IMAGE)")

promote: ## rollout: retag IMAGE as promoted (same digest) with the gate report REPORT beside it
	$(PY) -m rollout promote --image "$(IMAGE)" --report-dir "$(REPORT)"

cpu-image: ## rollout: build + push the CPU serving image of the embedded model (IMAGE=registry/name:tag)
	$(PY) -m rollout build-cpu-image --tag "$(IMAGE)"

lint-ansible: ## rollout: ansible-lint, production profile
	cd ansible && ANSIBLE_CONFIG=ansible.cfg ANSIBLE_INVENTORY=inventories/example $(ROLLOUT_ENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  $(CURDIR)/$(VENV)/bin/ansible-lint --offline --profile production playbooks/ roles/

test-rollout: ## rollout: real SSH test hosts + Docker + registry tests (tests/rollout)
	$(ROLLOUT_ENV) $(PY) -m pytest -q tests/rollout

bench-rollout: ## rollout: rollout wall time for 2, 4, 8 test hosts -> docs/rollout.md numbers
	$(ROLLOUT_ENV) $(PY) bench/rollout_time.py --hosts 2 4 8
