"""The Ansible half of a rollout to the PCIe and NVLink fleets (through ansible-runner) and the registry
client. The promotion flow that uses them (deploy -> gate -> load test -> promote) is flow/promote.py.

    python -m sglfleet.flow deploy      --hosts HOST_OR_GROUP --image REPO:TAG [--inventory DIR] [--check]
    python -m sglfleet.rollout rollback --hosts HOST_OR_GROUP
    python -m sglfleet.rollout status   --hosts HOST_OR_GROUP
    python -m sglfleet.rollout.collections install|check
"""

from sglfleet.paths import ANSIBLE_DIR, WORK_ROOT

__all__ = ["ANSIBLE_DIR", "WORK_ROOT"]
