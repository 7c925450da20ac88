"""Shared pieces of the pipeline: typed config, the OpenAI-compatible client, reports, the embedded target."""
