"""The validation gate: `python -m validation run|check-text|record-baseline`."""

from validation.config import DetectorThresholds, GateConfig, load_gate_config, lossless_requirement
from validation.detectors import Finding, score_text
from validation.gate import GateResult, run_gate

__all__ = ["DetectorThresholds", "Finding", "GateConfig", "GateResult", "load_gate_config", "lossless_requirement",
           "run_gate", "score_text"]
