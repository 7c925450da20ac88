"""A real CPU speculative engine (SmolLM2-135M-Instruct, numpy) with injectable verify-pass faults, served over
an OpenAI-compatible API: `python -m testbed.corruptible serve --port P [--fault F] [--budget B] [--topk K]`."""
