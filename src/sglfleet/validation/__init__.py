"""The validation gate: `python -m sglfleet.validation run|check-text|record-baseline`."""

from sglfleet.textscore.detectors import Finding, score_text
from sglfleet.validation.config import DetectorThresholds, GateConfig, load_gate_config, lossless_requirement
from sglfleet.validation.gate import GateResult, run_gate

__all__ = ["DetectorThresholds", "Finding", "GateConfig", "GateResult", "load_gate_config", "lossless_requirement",
           "run_gate", "score_text"]
