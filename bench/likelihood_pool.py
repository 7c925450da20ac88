"""Sample a pool of T>0 suite answers from one target (the embedded model by default), for the likelihood test.

    python bench/likelihood_pool.py --out /tmp/lik/pool.jsonl --seeds 1-24 [--target URL]

Every prompt of the suite at every T>0 of the gate config, once per seed, concurrency 4, top_p / top_k from
the gate's SamplingConfig, max_tokens from the suite: the same requests the gate sends, with the sampled ids
where the server names them (`ids`). Without --target the embedded llama.cpp server is started on a free port
(pipeline/embedded.py) and stopped at the end. Rows already in --out are kept (the run resumes); one JSON row
per answer. bench/likelihood_rates.py scores the pool and measures the test's false-fail rate on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglfleet.pipeline.client import OpenAIClient  # noqa: E402
from sglfleet.pipeline.errors import TargetError, UsageError, cli_main  # noqa: E402
from sglfleet.validation.config import GateConfig, load_gate_config  # noqa: E402
from sglfleet.validation.suite import load_suite  # noqa: E402


def parse_seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        try:
            out.extend(range(int(a), int(b) + 1) if b else [int(a)])
        except ValueError:
            raise UsageError(f"--seeds must look like 1-24 or 1,2,5, not {spec!r}") from None
    if not out or len(set(out)) != len(out):
        raise UsageError(f"--seeds must name distinct seeds, got {spec!r}")
    return out


def sample_pool(url: str, cfg: GateConfig, seeds: list[int], out: Path, concurrency: int = 4) -> int:
    suite = load_suite(cfg.suite)
    have = set()
    if out.is_file():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            have.add((r["prompt_id"], r["temperature"], r["seed"]))
    jobs = [(p, t, s) for s in seeds for t in sorted({t for t in cfg.temperatures if t > 0})
            for p in suite.prompts if (p.id, t, s) not in have]
    client = OpenAIClient(url, model=cfg.model, timeout_s=cfg.request_timeout_s)
    # the sampled ids, asked as the gate asks them (validation/gate.py): SGLang in sglext, llama.cpp in its
    # log-prob entries (one alternative; sampling is the same with or without)
    kind = client.server_kind()
    extra = dict(cfg.sampling.extra)
    if kind == "sglang":
        extra.setdefault("return_output_ids_in_sglext", True)

    def one(job: tuple) -> dict:
        p, t, s = job
        row = {"prompt_id": p.id, "temperature": t, "seed": s, "category": p.category}
        try:
            r = client.chat(p.messages(), max_tokens=cfg.max_tokens or p.max_tokens, temperature=t,
                            top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k, seed=s, stream=True,
                            extra=extra or None, top_logprobs=1 if kind == "llamacpp" else None)
            row.update(text=r.text, finish_reason=r.finish_reason, completion_tokens=r.completion_tokens,
                       ids=r.output_ids)
        except TargetError as exc:
            row["error"] = str(exc)
        return row

    n = 0
    t0 = time.time()
    with out.open("a") as fh, ThreadPoolExecutor(max_workers=concurrency) as pool:
        for row in pool.map(one, jobs):
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            n += 1
            if n % 24 == 0:
                print(f"{n}/{len(jobs)} answers in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    client.close()
    return n


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/likelihood_pool.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="1-24")
    ap.add_argument("--target", help="an OpenAI server; default: start the embedded model")
    ap.add_argument("--config", help="gate profile (default: the gate's defaults)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="embedded server threads (1 holds up better on a "
                    "machine whose cores are shared: llama.cpp's threads spin-wait on each other)")
    a = ap.parse_args(argv)
    cfg = load_gate_config(a.config)
    seeds = parse_seeds(a.seeds)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.target:
        n = sample_pool(a.target, cfg, seeds, out, a.concurrency)
    else:
        from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
        from sglfleet.textscore.judge import _free_port

        ecfg = EmbeddedConfig(port=_free_port(), threads=a.threads)
        with EmbeddedServer(ecfg, tempfile.mkdtemp(prefix="lik-pool-")) as srv:
            n = sample_pool(srv.url, cfg, seeds, out, a.concurrency)
    print(f"{n} answers appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
