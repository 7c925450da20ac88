"""Rollout of the serving image to the PCIe and NVLink fleets: Ansible (through ansible-runner) for the
hosts, the validation gate for each new endpoint, the registry for promotion.

    python -m rollout deploy   --hosts HOST_OR_GROUP --image REPO:TAG [--inventory DIR] [--check]
    python -m rollout rollback --hosts HOST_OR_GROUP
    python -m rollout status   --hosts HOST_OR_GROUP
    python -m rollout promote  --image REPO:TAG --report-dir DIR
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ANSIBLE_DIR = REPO_ROOT / "ansible"
