"""gpu_session.sh's corpus_in, run by bash: which corpus a `train` call builds on (its base) for each recipe, from
the files a warm machine (/tmp/corpus) or the carry (.carry/drafter) holds. A wrong base makes the target write
answers the carry already has, or ask prompts again that a self-asked corpus keeps."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "ddtree" / "gpu_session.sh"


def _base(tmp_path: Path, carried: list[str], **env: str) -> str:
    """The --base-corpus corpus_in chooses with ``carried`` in .carry/drafter (empty: none)."""
    lines = SCRIPT.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("CORPUS_XZ="))
    end = next(i for i, x in enumerate(lines) if i > start and x == "}")  # corpus_in's end
    work = tmp_path / "w"
    (work / ".carry" / "drafter").mkdir(parents=True)
    for name in carried:
        (work / ".carry" / "drafter" / name).write_text("x")
    (work / "testbed/models/corpora").mkdir(parents=True)
    (work / "testbed/models/corpora/smollm2-2400x256-seed0.pt.xz").write_text("x")
    prog = "\n".join(lines[start:end + 1]) + '\ncorpus_in; echo "${base_corpus[*]:-none}"\n'
    tmp_corpus = tmp_path / "corpus"  # stands for /tmp/corpus, empty: a fresh machine
    prog = prog.replace("/tmp/corpus", str(tmp_corpus))
    out = subprocess.run(["bash", "-c", prog], cwd=work, env={"PATH": "/usr/bin:/bin", **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().removeprefix("--base-corpus ")


@pytest.mark.parametrize("carried,env,want", [
    # the default recipe: its own corpus, no base
    ([], {}, "none"),
    # a second answer to the pool's prompts: the one-answer corpus of the carry, else the tree's
    (["corpus.pt"], {"ANSWERS": "2"}, ".carry/drafter/corpus.pt"),
    ([], {"ANSWERS": "2"}, "testbed/models/corpora/smollm2-2400x256-seed0.pt.xz"),
    # a third: the two-answer corpus
    (["corpus.pt", "corpus-2400x256-a2.pt"], {"ANSWERS": "3"}, ".carry/drafter/corpus-2400x256-a2.pt"),
    # self-asked prompts, one answer: the pool's one-answer corpus (only the asked prompts are answered)
    (["corpus.pt"], {"SELF_ASKED": "4800"}, ".carry/drafter/corpus.pt"),
    # a second answer with the same self-asked prompts: the self-asked one-answer corpus, which keeps their words
    (["corpus.pt", "corpus-2400x256-a2.pt", "corpus-2400x256-a1-s4800.pt"], {"ANSWERS": "2", "SELF_ASKED": "4800"},
     ".carry/drafter/corpus-2400x256-a1-s4800.pt"),
    # without it, the pool's two-answer corpus (the asked prompts are asked and answered twice)
    (["corpus.pt", "corpus-2400x256-a2.pt"], {"ANSWERS": "2", "SELF_ASKED": "4800"},
     ".carry/drafter/corpus-2400x256-a2.pt"),
    # another count of asked prompts is another recipe: not its base
    (["corpus.pt", "corpus-2400x256-a1-s2400.pt"], {"ANSWERS": "2", "SELF_ASKED": "4800"},
     ".carry/drafter/corpus.pt"),
])
def test_a_train_call_builds_on_the_corpus_with_the_most_of_its_recipe(tmp_path, carried, env, want) -> None:
    assert _base(tmp_path, carried, **env) == want
