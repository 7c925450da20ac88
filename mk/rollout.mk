# Rollout to the PCIe and NVLink fleets (src/sglfleet/ansible/, src/sglfleet/rollout/, docs/rollout.md).
#   make deploy-target-only HOST=... IMAGE=...   the same image without speculative decoding, not gated, not
#                 promoted: the server `make record-baseline` records the lossless baseline from
#   make deploy   HOST=<host|group> IMAGE=<registry>/<name>:<tag> [INVENTORY=dir] [CHECK=1] [GATE_CONFIG=f]
#                 [BASELINE=baseline.json] [LOADTEST_CONFIG=f (its loadtest: SLOs)] [IMAGE_TARBALL=docker-save.tar]
#                 [ROLLOUT_CONFIG=deployment.yaml]
#   make rollback HOST=...   make status HOST=...   make router [STOP=1]   (sglang-router per fleet group)
.PHONY: deploy deploy-target-only rollout-need-host rollback status render router lint-ansible bench-rollout test-rollout cpu-image

HOST ?=
IMAGE ?=
INVENTORY ?= src/sglfleet/ansible/inventories/example
ROLLOUT_CONFIG ?=
GATE_CONFIG ?=
CHECK ?=
LOADTEST_CONFIG ?=
IMAGE_TARBALL ?=
BASELINE ?=
ROLLOUT_ARGS = --hosts "$(HOST)" --inventory "$(INVENTORY)" $(if $(ROLLOUT_CONFIG),--config "$(ROLLOUT_CONFIG)")
ROLLOUT_ENV = ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/.cache/ansible-collections

rollout-need-host:
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	@test -n "$(IMAGE)" || { echo "error: set IMAGE=<registry>/<name>:<tag>" >&2; exit 2; }

# Exit codes 0 / 1 (a stage failed, changed hosts rolled back) / 2 (bad input) reach the shell (mk/exit-code.inc).
KEEP_RC_CMD_deploy = $(ROLLOUT_ENV) $(PY) -m sglfleet.flow deploy $(ROLLOUT_ARGS) --image "$(IMAGE)"$(if $(CHECK), --check)$(if $(GATE_CONFIG), --gate-config "$(GATE_CONFIG)")$(if $(BASELINE), --baseline "$(BASELINE)")$(if $(LOADTEST_CONFIG), --loadtest-config "$(LOADTEST_CONFIG)")$(if $(IMAGE_TARBALL), --image-tarball "$(IMAGE_TARBALL)")
KEEP_RC_NEED_deploy = $(and $(HOST),$(IMAGE))
deploy: $$(call KEEP_RC_PREREQ,deploy,rollout-need-host) ## [deploy] deploy IMAGE to HOST, gate, load test, then promote or roll back [GATE_CONFIG= BASELINE= CHECK=1]
	$(KEEP_RC_RUN)

KEEP_RC_CMD_deploy-target-only = $(ROLLOUT_ENV) $(PY) -m sglfleet.flow deploy $(ROLLOUT_ARGS) --image "$(IMAGE)" --target-only$(if $(CHECK), --check)$(if $(IMAGE_TARBALL), --image-tarball "$(IMAGE_TARBALL)")
KEEP_RC_NEED_deploy-target-only = $(and $(HOST),$(IMAGE))
deploy-target-only: $$(call KEEP_RC_PREREQ,deploy-target-only,rollout-need-host) ## [deploy] deploy IMAGE to HOST without speculative decoding, no gate, no promotion (for record-baseline)
	$(KEEP_RC_RUN)

KEEP_RC_CMD_rollback = $(ROLLOUT_ENV) $(PY) -m sglfleet.rollout rollback $(ROLLOUT_ARGS) $(if $(CHECK),--check)
KEEP_RC_NEED_rollback = $(HOST)
rollback: $$(call KEEP_RC_PREREQ,rollback,) ## [deploy] put HOST back on its recorded previous image [CHECK=1]
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(KEEP_RC_RUN)

KEEP_RC_CMD_status = $(ROLLOUT_ENV) $(PY) -m sglfleet.rollout status $(ROLLOUT_ARGS)
KEEP_RC_NEED_status = $(HOST)
status: $$(call KEEP_RC_PREREQ,status,) ## [deploy] current/previous image, container and health of HOST
	@test -n "$(HOST)" || { echo "error: set HOST=<host or group>" >&2; exit 2; }
	$(KEEP_RC_RUN)

render: ## [deploy] show the server container each host of HOST would run (no connection)
	$(ROLLOUT_ENV) $(PY) -m sglfleet.rollout render $(ROLLOUT_ARGS) $(if $(IMAGE),--image "$(IMAGE)")

router: ## [deploy] deploy sglang-router on the inventory's sglang_router hosts (src/sglfleet/ansible/roles/router) [INVENTORY=dir STOP=1]
	$(ROLLOUT_ENV) $(PY) -m sglfleet.rollout router --inventory "$(INVENTORY)" $(if $(ROLLOUT_CONFIG),--config "$(ROLLOUT_CONFIG)") $(if $(STOP),--stop)

cpu-image: ## [lab] test bed: build + push the CPU serving image of the embedded model (IMAGE=registry/name:tag)
	$(PY) -m testbed.cpuimage "$(IMAGE)"

lint-ansible: ## [ci] rollout: ansible-lint, production profile
	cd src/sglfleet/ansible && ANSIBLE_CONFIG=ansible.cfg ANSIBLE_INVENTORY=inventories/example $(ROLLOUT_ENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  $(CURDIR)/$(VENV)/bin/ansible-lint --offline --profile production playbooks/ roles/

test-rollout: ## [deploy] tests of this stage: real SSH test hosts + Docker + registry tests (tests/rollout)
	$(ROLLOUT_ENV) $(PY) -m pytest -q tests/rollout

bench-rollout: ## [lab] rollout: rollout wall time for 2, 4, 8 test hosts -> docs/rollout.md numbers
	$(ROLLOUT_ENV) $(PY) bench/rollout_time.py --hosts 2 4 8
