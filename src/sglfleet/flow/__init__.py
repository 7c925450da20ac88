"""The promotion flow: deploy -> gate -> load test (SLO verdict) -> promote or roll back, in one process.

    python -m sglfleet.flow deploy   --hosts HOST_OR_GROUP --image REGISTRY/NAME:TAG [--inventory DIR] [--check]
    python -m sglfleet.flow main     the main job on the embedded target (make demo-light)
    python -m sglfleet.flow demo     the real path on an embedded fleet on this machine (make demo, root)

Each stage (rollout, validation, loadtests, the registry) is called in process and returns a typed
result; flow/report.py writes one report (HTML + JSON + JUnit) that links every stage's own report.
"""
