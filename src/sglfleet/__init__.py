"""sglfleet: build, roll out, gate and load-test SGLang (DFlash/DDTree) on Blackwell fleets.

Subpackages: pipeline (shared pieces), validation (the gate), loadtests, images, patches (the sglang patch
series), rollout (Ansible through ansible-runner), flow (deploy -> gate -> load test -> promote). ansible/ (playbooks,
roles, the example inventory) and the patch series ship inside the package; sglfleet.paths finds them.
"""
