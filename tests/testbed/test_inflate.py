"""``python -m testbed.models inflate`` (testbed/models/inflate.py) on CPU: a tiny random Llama with
SmolLM2's structure problem (3 q heads per kv head, going to 4 or 2 per kv head) inflated to a
larger shape computes the same logits in transformers, its DFlash drafter inflated with it drafts
the same logits from the inflated target's features, and a shape that cannot hold the source is
one clear error with nothing written."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from sglfleet.pipeline.errors import UsageError
from testbed.models import __main__ as cli
from testbed.models import dflash_train, drafter, inflate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SRC = dict(vocab_size=128, hidden_size=96, intermediate_size=160, num_hidden_layers=4, num_attention_heads=6,
           num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
           tie_word_embeddings=True, initializer_range=0.15)
BIG = inflate.Shape(hidden=128, layers=7, heads=8, kv_heads=2, intermediate=320, head_dim=32)
# 2 q heads per kv head (each source group spread over two kv copies) and head_dim x3 (not a power of two)
ODD = inflate.Shape(hidden=128, layers=6, heads=8, kv_heads=4, intermediate=200, head_dim=48)
IDS = [1, 2]  # the drafter's target layers (0..num_hidden_layers - 2)


def _random_gains(model: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SRC)).eval()
    _random_gains(m, torch.Generator().manual_seed(1))
    d = tmp_path_factory.mktemp("inflate") / "src"
    m.save_pretrained(str(d))
    (d / "tokenizer_config.json").write_text('{"model_max_length": 1024}')
    return d


def _load(d: Path) -> torch.nn.Module:
    return transformers.LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, SRC["vocab_size"], (2, 20), generator=g)
    pos = torch.arange(400, 420).unsqueeze(0).expand(2, -1)  # far out: every rotary pair has turned
    return ids, pos


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


@pytest.mark.parametrize("shape", [BIG, ODD], ids=["4-per-kv", "2-per-kv-head-dim-x3"])
def test_inflated_target_computes_the_same_logits(source: Path, tmp_path: Path, shape: inflate.Shape) -> None:
    out = tmp_path / "big"
    cfg = inflate.inflate(source, out, shape, dtype="float32", shard_bytes=200_000)  # several shards
    src, big = _load(source), _load(out)
    ids, pos = _ids()
    with torch.no_grad():
        a = src(ids, position_ids=pos).logits
        b = big(ids, position_ids=pos).logits
    assert b.shape == a.shape and _rel(a, b) < 1e-4, _rel(a, b)
    disk = json.loads((out / "config.json").read_text())
    assert disk == cfg
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"]) == (shape.hidden, shape.layers, shape.heads, shape.kv_heads,
                                                            shape.head_dim, shape.intermediate)
    assert cfg["vocab_size"] == SRC["vocab_size"] and cfg["tie_word_embeddings"] is True
    assert math.isclose(cfg["rms_norm_eps"], SRC["rms_norm_eps"] * 96 / 128)
    assert cfg["rope_parameters"] == src.config.rope_parameters  # the frequencies come from the placement:
    m = shape.head_dim // 16  # source pair i is pair m * i, turning at the same rate, bit for bit
    assert torch.equal(big.model.rotary_emb.inv_freq[::m], src.model.rotary_emb.inv_freq)
    layer_map = cfg["inflated_from"]["layer_map"]
    assert layer_map == [i * shape.layers // 4 for i in range(4)] and cfg["inflated_from"]["hidden_size"] == 96
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not list(out.glob("*.tmp"))
    assert (out / "tokenizer_config.json").read_text() == (source / "tokenizer_config.json").read_text()
    umask = os.umask(0)
    os.umask(umask)
    assert {f.stat().st_mode & 0o777 for f in out.iterdir()} == {0o666 & ~umask}  # not mkdtemp's private modes
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    for j in set(range(shape.layers)) - set(layer_map):  # identity layers: still full size, writing nothing
        layer = big.model.layers[j]
        assert layer.mlp.down_proj.weight.shape == (shape.hidden, shape.intermediate)
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()


def test_bfloat16_output_is_the_source_up_to_rounding(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    inflate.inflate(source, out, BIG)
    from safetensors.torch import load_file

    sd = load_file(str(out / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    ids, pos = _ids()
    src = _load(source)
    with torch.no_grad():
        a = src(ids, position_ids=pos).logits
        b = _load(out)(ids, position_ids=pos).logits
        for p in src.parameters():  # the float32 source stored in bf16: the rounding inflating may add to
            p.copy_(p.to(torch.bfloat16).float())
        c = src(ids, position_ids=pos).logits
    print(f"bf16: inflated {_rel(a, b):.4f}, source rounded {_rel(a, c):.4f}")
    assert _rel(a, b) < 2 * _rel(a, c), (_rel(a, b), _rel(a, c))


def test_the_smollm2_to_llama3_8b_plan() -> None:
    smol = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                intermediate_size=1536, rms_norm_eps=1e-5)
    p = inflate.plan(smol, inflate.Shape(**inflate.LLAMA3_8B))
    assert p.q_map == (0, 1, 2, 4, 5, 6, 8, 9, 10) and p.kv_map == (0, 1, 2, -1, -1, -1, -1, -1)
    assert p.dims == tuple(2 * t for t in range(32)) + tuple(64 + 2 * t for t in range(32))
    assert len(set(p.layer_map)) == 30 and p.layer_map[0] == 0 and max(p.layer_map) <= 31
    assert math.isclose(p.eps_out, 1e-5 * 576 / 4096) and math.isclose(math.sqrt(p.r), 0.375)
    # the rotary pair i of a 64-dim head and the pair 2i of a 128-dim head turn at the same rate
    theta = 100000.0
    for i in range(32):
        assert theta ** (-(2 * i) / 64) == theta ** (-(2 * p.dims[i]) / 128)


def _drafter_src(target_dir: Path, out: Path) -> Path:
    tcfg = json.loads((target_dir / "config.json").read_text())
    torch.manual_seed(3)
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(tcfg, layers=2, n_features=len(IDS)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(3.0)  # sharper attention than nn.Linear's init
    _random_gains(model, torch.Generator().manual_seed(4))
    return dflash_train.export(model, tcfg, out, {"block_size": 4, "layers": 2, "target_layer_ids": IDS})


def _drafter_load(d: Path) -> tuple[torch.nn.Module, list[int]]:
    from safetensors.torch import load_file

    cfg = json.loads((d / "config.json").read_text())
    ids = cfg["dflash_config"]["target_layer_ids"]
    m = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=cfg["num_hidden_layers"], n_features=len(ids)))
    m.load_state_dict({k: v.float() for k, v in load_file(str(d / "model.safetensors")).items()})
    return m.eval(), ids


@pytest.mark.parametrize("shape", [BIG, ODD], ids=["4-per-kv", "2-per-kv-head-dim-x3"])
def test_inflated_drafter_drafts_the_same_logits(source: Path, tmp_path: Path, shape: inflate.Shape) -> None:
    dsrc = _drafter_src(source, tmp_path / "d")
    out, dout = tmp_path / "big", tmp_path / "dbig"
    cfg = inflate.inflate(source, out, shape, drafter_src=dsrc, drafter_out=dout, dtype="float32")
    info = drafter.check_dirs(out, dout, block_size=4)  # what check-drafter runs before a server starts
    assert list(info.target_layer_ids) == [cfg["inflated_from"]["layer_map"][i] for i in IDS]
    src_t, big_t = _load(source), _load(out)
    (src_d, ids0), (big_d, ids1) = _drafter_load(dsrc), _drafter_load(dout)
    assert ids0 == IDS and ids1 == list(info.target_layer_ids)
    seq = torch.randint(0, SRC["vocab_size"], (24,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        f0 = dflash_train._features(src_t, seq, ids0)
        f1 = dflash_train._features(big_t, seq, ids1)
        for k in range(len(IDS)):  # each inflated feature is the source's, zero-padded
            part = f1[:, k * shape.hidden : (k + 1) * shape.hidden]
            assert _rel(f0[:, k * 96 : (k + 1) * 96], part[:, :96]) < 1e-5 and not part[:, 96:].any()
        block = torch.full((3, 4), SRC["vocab_size"] - 1)
        anchors = torch.tensor([6, 13, 19])
        block[:, 0] = seq[anchors]
        a = src_t.lm_head(src_d(f0, src_t.get_input_embeddings()(block), anchors))
        b = big_t.lm_head(big_d(f1, big_t.get_input_embeddings()(block), anchors))
    assert _rel(a, b) < 1e-4, _rel(a, b)
    dcfg = json.loads((dout / "config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["dflash_config"]["block_size"] == 4
    assert dcfg["inflated_from"]["target_layer_ids"] == IDS and dcfg["num_hidden_layers"] == 2


BAD = [
    (dict(hidden=64), "--hidden 64 is smaller than the source's 96"),
    (dict(heads=8, kv_heads=3), "--kv-heads 3 does not divide --heads 8"),
    (dict(layers=3), "--layers 3 is smaller than the source's 4"),
    (dict(heads=4, kv_heads=2, head_dim=32), "cannot hold the source's 2 kv heads of 3 q heads"),
    (dict(head_dim=40), "not a multiple of the source's 16"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split()[0] for _, m in BAD])
def test_a_shape_that_cannot_hold_the_source_is_one_error(source: Path, tmp_path: Path, change: dict,
                                                          message: str, capsys: pytest.CaptureFixture[str]) -> None:
    shape = inflate.Shape(**{**asdict(BIG), **change})
    out = tmp_path / "big"
    with pytest.raises(UsageError, match=re.escape(message)):
        inflate.inflate(source, out, shape)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    argv = ["inflate", "--src", str(source), "--out", str(out)]
    for k, v in asdict(shape).items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_cli_writes_the_target_and_its_drafter(source: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    dsrc = _drafter_src(source, tmp_path / "d")
    argv = ["inflate", "--src", str(source), "--out", str(tmp_path / "big"), "--hidden", "256", "--layers", "7",
            "--heads", "8", "--kv-heads", "2", "--intermediate", "320", "--drafter-src", str(dsrc)]
    assert cli.main(argv) == 2 and "go together" in capsys.readouterr().err
    assert not (tmp_path / "big").exists()
    assert cli.main([*argv, "--drafter-out", str(tmp_path / "dbig")]) == 0
    assert "hidden 96 -> 256" in capsys.readouterr().out
    assert json.loads((tmp_path / "big" / "config.json").read_text())["head_dim"] == 32  # hidden / heads
    assert drafter.check_dirs(tmp_path / "big", tmp_path / "dbig").target_layer_ids == (1, 3)
