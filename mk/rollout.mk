# Rollout to the PCIe and NVLink fleets (ansible/, rollout/, docs/rollout.md).
#   make deploy   HOST=<host|group> IMAGE=<registry>/<name>:<tag> [INVENTORY=dir] [CHECK=1] [GATE_CONFIG=f]
#                 [LOADTEST_CONFIG=f (its loadtest: SLOs)] [IMAGE_TARBALL=docker-save.tar] [CONFIG=deployment.yaml]
#   make rollback HOST=...   make status HOST=...
.PHONY: deploy rollback status render lint-ansible bench-rollout test-rollout cpu-image

HOST ?=
IMAGE ?=
INVENTORY ?= ansible/inventories/example
ROLLOUT_CONFIG ?=
GATE_CONFIG ?=
CHECK ?=
LOADTEST_CONFIG ?=
IMAGE_TARBALL ?=
ROLLOUT_ARGS = --hosts "$(HOST)" --inventory "$(INVENTORY)" $(if $(ROLLOUT_CONFIG),--config "$(ROLLOUT_CONFIG)")
ROLLOUT_ENV = ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/.cache/ansible-collections

deploy: ## flow: deploy IMAGE to HOST, gate, load test against the SLOs, then promote or roll back [CHECK=1 IMAGE_TARBALL=f]
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m flow deploy $(ROLLOUT_ARGS) --image "$(IMAGE)"$(if $(CHECK), --check)$(if $(GATE_CONFIG), --gate-config "$(GATE_CONFIG)")$(if $(LOADTEST_CONFIG), --loadtest-config "$(LOADTEST_CONFIG)")$(if $(IMAGE_TARBALL), --image-tarball "$(IMAGE_TARBALL)")

rollback: ## rollout: put HOST back on its recorded previous image [CHECK=1]
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m rollout rollback $(ROLLOUT_ARGS) $(if $(CHECK),--check)

status: ## rollout: current/previous image, container and health of HOST
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(ROLLOUT_ENV) $(PY) -m rollout status $(ROLLOUT_ARGS)

render: ## rollout: show the server container each host of HOST would run (no connection)
	$(ROLLOUT_ENV) $(PY) -m rollout render $(ROLLOUT_ARGS) $(if $(IMAGE),--image "$(IMAGE)")

cpu-image: ## rollout (test bed): build + push the CPU serving image of the embedded model (IMAGE=registry/name:tag)
	$(PY) -m tests.support.cpuimage "$(IMAGE)"

lint-ansible: ## rollout: ansible-lint, production profile
	cd ansible && ANSIBLE_CONFIG=ansible.cfg ANSIBLE_INVENTORY=inventories/example $(ROLLOUT_ENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  $(CURDIR)/$(VENV)/bin/ansible-lint --offline --profile production playbooks/ roles/

test-rollout: ## rollout: real SSH test hosts + Docker + registry tests (tests/rollout)
	$(ROLLOUT_ENV) $(PY) -m pytest -q tests/rollout

bench-rollout: ## rollout: rollout wall time for 2, 4, 8 test hosts -> docs/rollout.md numbers
	$(ROLLOUT_ENV) $(PY) bench/rollout_time.py --hosts 2 4 8
