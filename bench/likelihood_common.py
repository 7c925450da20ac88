"""Shared by the likelihood benchmarks: score stored answers once (a JSONL cache keyed by the answer), and
the provenance block every raw result carries."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglfleet.validation.scorers import AnswerScore, Scorer  # noqa: E402
from sglfleet.validation.suite import Suite  # noqa: E402


def provenance(argv: list[str]) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip())
    except OSError:
        commit, dirty = "", False
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {"command": " ".join(["python", *argv]), "date": now,
            "machine": {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "commit": commit + ("-dirty" if dirty else "")}


def _key(pid: str, t: float, seed: Any, text: str, stop: bool, scorer: str,
         ids: tuple[int, ...] | None = None) -> str:
    on = "" if ids is None else "\0ids:" + ",".join(map(str, ids))  # a text-scored answer keeps its old key
    h = hashlib.sha256(f"{scorer}\0{pid}\0{t!r}\0{seed!r}\0{stop}\0{text}{on}".encode()).hexdigest()
    return h[:32]


class ScoreCache:
    """AnswerScores on disk (one JSON row each), so every benchmark scores an answer once."""

    def __init__(self, path: str | Path, scorer: Scorer, suite: Suite) -> None:
        self.path = Path(path)
        self.scorer = scorer
        self.suite = suite
        self.rows: dict[str, AnswerScore] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                r = json.loads(line)
                k = r.pop("key")
                r["token_logprobs"] = tuple(r["token_logprobs"])
                r["support_logprobs"] = tuple(r["support_logprobs"]) if r["support_logprobs"] is not None else None
                r["pieces"] = tuple(r["pieces"])
                self.rows[k] = AnswerScore(**r)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def score(self, pid: str, t: float, seed: Any, text: str, stop: bool,
              ids: tuple[int, ...] | None = None) -> AnswerScore:
        """ids: the sampled ids, scored instead of the text re-tokenized (a scorer with `scores_ids`)."""
        k = _key(pid, t, seed, text, stop, self.scorer.name, ids)
        if k not in self.rows:
            kw = {"ids": ids} if ids is not None else {}
            a = self.scorer.score(self.suite.get(pid).messages(), text, t, prompt_id=pid, seed=seed, stop=stop, **kw)
            self.rows[k] = a
            with self.path.open("a") as fh:
                fh.write(json.dumps({"key": k, **a.__dict__}) + "\n")
        return self.rows[k]
