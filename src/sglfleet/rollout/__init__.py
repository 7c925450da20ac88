"""The Ansible half of a rollout to the PCIe and NVLink fleets (through ansible-runner) and the registry
client. The promotion flow that uses them (deploy -> gate -> load test -> promote) is flow/promote.py.

    python -m flow deploy      --hosts HOST_OR_GROUP --image REPO:TAG [--inventory DIR] [--check]
    python -m rollout rollback --hosts HOST_OR_GROUP
    python -m rollout status   --hosts HOST_OR_GROUP
    python -m rollout.collections install|check
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ANSIBLE_DIR = REPO_ROOT / "ansible"
