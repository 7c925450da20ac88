"""GGUF -> Hugging Face conversion of the embedded target (models/gguf_to_hf.py), on CPU: the
converted checkpoint computes the same logits as transformers' own GGUF loader, and bad input is
one clear error with nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglfleet.pipeline.errors import UsageError
from testbed.models import gguf_to_hf

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
    p = subprocess.run([sys.executable, "-m", "testbed.models", "convert", "--gguf", str(tmp_path / "none.gguf"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert p.returncode == 2 and "no such GGUF file" in p.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    p = subprocess.run([sys.executable, "-m", "testbed.models", "convert", "--gguf", str(junk), "--out",
                        str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "not a readable GGUF file" in p.stderr


# ----------------------------------------------------------------------------- drafter check

TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576}


def test_a_drafter_shaped_for_the_target_passes() -> None:
    from testbed.models import drafter

    cfg = drafter.drafter_config_for(TARGET, block_size=8)
    info = drafter.check(TARGET, cfg, block_size=8)
    assert info.block_size == 8 and info.target_layer_ids == (1, 15, 28) and info.mask_token_id == 49151


@pytest.mark.parametrize("edit,block,message", [
    (lambda c: c["dflash_config"].update(block_size=16), 8, "trained for block size 16, the server is configured"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 30]), None, "reads target layers [30]"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[]), None, "non-empty list of ints"),
    (lambda c: c.update(vocab_size=32000), None, "vocab_size 32000 != target vocab_size 49152"),
    (lambda c: c.update(hidden_size=1024), None, "hidden_size 1024 != target"),
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), None, "is not [DFlashDraftModel]"),
    (lambda c: c["dflash_config"].update(mask_token_id=49152), None, "outside the target vocabulary"),
])
def test_a_mismatched_drafter_is_one_clear_error(edit, block, message: str) -> None:
    import copy

    from testbed.models import drafter

    cfg = copy.deepcopy(drafter.drafter_config_for(TARGET, block_size=8))
    edit(cfg)
    with pytest.raises(UsageError) as e:
        drafter.check(TARGET, cfg, block_size=block)
    assert message in str(e.value)


def test_check_drafter_cli_exit_codes(tmp_path: Path) -> None:
    import json

    from testbed.models import drafter

    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(TARGET))
    (tmp_path / "d" / "config.json").write_text(json.dumps(drafter.drafter_config_for(TARGET, block_size=8)))
    run = lambda *a: subprocess.run([sys.executable, "-m", "testbed.models", "check-drafter", *a],  # noqa: E731
                                    capture_output=True, text=True)
    ok = run("--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"), "--block-size", "8")
    assert ok.returncode == 0 and "block 8" in ok.stdout
    bad = run("--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"), "--block-size", "4")
    assert bad.returncode == 2 and "trained for block size 8" in bad.stderr
    missing = run("--target", str(tmp_path / "nope"), "--drafter", str(tmp_path / "d"))
    assert missing.returncode == 2 and "no config.json" in missing.stderr
