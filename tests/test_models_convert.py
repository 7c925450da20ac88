"""GGUF -> Hugging Face conversion of the embedded target (models/gguf_to_hf.py), on CPU: the
converted checkpoint computes the same logits as transformers' own GGUF loader, and bad input is
one clear error with nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models import gguf_to_hf
from pipeline.errors import UsageError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "smollm2"
    gguf_to_hf.convert(gguf_to_hf.smollm2_gguf(), out)
    return out


@pytest.mark.slow
def test_converted_checkpoint_matches_transformers_gguf_loader(converted: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_to_hf.smollm2_gguf()
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    mine = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(converted))
    ids = tok("The lighthouse keeper trimmed the lamp and watched the", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        a = ref(ids).logits[0].float()
        b = mine(ids).logits[0].float()
    # bf16 storage of the dequantized weights: small differences, the same next tokens
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (a - b).abs().max().item() < 0.5
    cfg = (converted / "config.json").read_text()
    assert '"LlamaForCausalLM"' in cfg and '"num_hidden_layers": 30' in cfg
    assert tok.chat_template, "the chat template travels with the tokenizer"


def test_another_architecture_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="architecture 'gpt2' is not supported"):
        gguf_to_hf.convert(path, out)
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


def test_cli_bad_input_exits_2(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "models", "convert", "--gguf", str(tmp_path / "none.gguf"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert p.returncode == 2 and "no such GGUF file" in p.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    p = subprocess.run([sys.executable, "-m", "models", "convert", "--gguf", str(junk), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "not a readable GGUF file" in p.stderr
