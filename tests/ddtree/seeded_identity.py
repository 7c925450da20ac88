"""GPU experiment (H200, not collected by pytest): is a correct DDTree server's seeded T>0 output the target-only
server's own, token for token, when both run with --enable-deterministic-inference?

SGLang's seeded sampler (multinomial_with_seed) draws a token from Gumbel noise hashed from (seed, position,
token id). The DDTree worker draws the target's token at every tree node the same way, keyed by the node's
position, so a correct build should emit, at every position, the token the target-only server draws there
with the same seed: T>0 would become as checkable as T=0 (up to numerical near-ties of the perturbed scores).
A sampler fault (the worker's step_shared_random test fault) should break the identity within a few tokens.

    python3 tests/ddtree/seeded_identity.py --drafter /tmp/smollm2-dflash --deadline 400   # writes $OUT/seeded.json

Run by tests/ddtree/gpu_session.sh seeded (after install1..3 and drafter).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import incident
import serve_matrix as sm

SERVERS = ("base", "patched-b16-k4", "shared-b16-k4")
PROMPTS = ("Write a short poem about the ocean.", "Explain how a bicycle stays upright.",
           "List five fruits and one fact about each.", "Write a Python function that reverses a string.")


def generate(url: str, ids: list[int], temperature: float, seed: int, max_new: int) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": temperature,
                                                  "sampling_seed": seed}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            got = json.loads(r.read())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if isinstance(got, list):
        got = got[0]
    ids = got.get("output_ids")
    # the token ids where the server returns them, else the text (compared character by character)
    return {"ids": [int(i) for i in ids] if isinstance(ids, list) and ids else None, "text": got.get("text", "")}


def first_divergence(a: list | str, b: list | str) -> int | None:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--deadline", type=float, default=400)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=64)
    a = ap.parse_args()
    t0 = time.time()
    (sm.OUT / "logs").mkdir(parents=True, exist_ok=True)
    sm.build_variant("patched")
    plug = sm.install_plugins()
    sys.path.insert(0, str(plug))
    sm.setup_model("smollm2", a.drafter)
    servers = [s for s in incident.plan() if s.name in SERVERS]
    for s in servers:
        s.argv = [*s.argv, "--enable-deterministic-inference"]
        s.start(plug)
        time.sleep(0.5)
    incident.wait_up(servers, t0 + a.deadline - 90)
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": sm._machine(),
                 "command": " ".join(sys.argv), "servers": {}, "requests": []}
    for s in servers:
        doc["servers"][s.name] = {"up_s": s.up_s, "argv": s.argv, "env": s.env,
                                  "error": None if s.up_s else s.log.read_text(errors="replace")[-2500:]}
    print(f"servers up: {[s.name for s in servers if s.up_s]} at {time.time() - t0:.0f}s", flush=True)
    up = {s.name: s for s in servers if s.up_s}
    if "base" in up:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(sm.MODEL["path"])
        for text in PROMPTS:
            ids = incident.chat_ids(tok, text)
            for t in (0.0, 0.6, 0.8, 1.0):
                for seed in range(1, (1 if t == 0 else a.seeds) + 1):
                    if time.time() > t0 + a.deadline - 20:
                        break
                    row: dict = {"prompt": text[:40], "temperature": t, "seed": seed}
                    got = {n: generate(s.url, ids, t, seed, a.max_new) for n, s in up.items()}
                    on = "ids" if all(g.get("ids") for g in got.values()) else "text"
                    row["compared_on"] = on
                    ref = got["base"].get(on)
                    for n, g in got.items():
                        row[n] = {"n": len(g.get(on) or []), "error": g.get("error"),
                                  "head": (g.get("text") or "")[:80]}
                        if n != "base" and ref is not None and g.get(on) is not None:
                            row[n]["first_divergence"] = first_divergence(ref, g[on])
                            row[n]["identical"] = ref == g[on]
                    doc["requests"].append(row)
    for n in SERVERS:
        rows = [r[n] for r in doc["requests"] if n in r and r["temperature"] > 0 and "identical" in r[n]]
        if rows:
            doc.setdefault("summary", {})[n] = {
                "t_gt0_requests": len(rows), "identical": sum(r["identical"] for r in rows),
                "first_divergences": sorted(r["first_divergence"] for r in rows if r["first_divergence"] is not None)}
    doc["wall_s"] = time.time() - t0
    (sm.OUT / "seeded.json").write_text(json.dumps(doc))
    print(json.dumps(doc.get("summary"), indent=1), flush=True)
    sm.stop_all(servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
