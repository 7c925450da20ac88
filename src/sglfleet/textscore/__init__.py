"""Baseline-free text scoring: what a text alone says of the engine that wrote it, with no target-only baseline.

- detectors.py: the garbage detectors (character runs, n-gram loops, token soup, mojibake, ...), `score_text`;
  their limits are config.py's `DetectorThresholds` (the gate config's `thresholds`)
- backstop.py: what no correct engine emits (invalid UTF-8 at T=0, control characters, leaked chat-template tokens)
- judge.py: the fluency judge, an independent reference model scoring every text (refmodel.py: its numpy forward
  pass over the GGUF weights; gguf_tokenizer.py: the file's own tokenizer, in process)
- synth.py: coherent and corrupted texts, the families the judge's limits and the likelihood test's power use

The gate (sglfleet.validation) uses them in detectors mode, where no target-only baseline decides a temperature.
"""
