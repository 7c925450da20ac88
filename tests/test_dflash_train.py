"""The DFlash drafter trainer (models/dflash_train.py) on CPU with a tiny random target: the loss
falls on target-written text, the export has the layout and config sglang's DFlashDraftModel
loads (checked against the target), and it reloads to the same outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from models import dflash_train, drafter  # noqa: E402

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=True)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY)
    m = transformers.LlamaForCausalLM(cfg).eval()
    # text the target writes itself (greedy: a function of its context, so learnable), several blocks long
    g = torch.Generator().manual_seed(1)
    seqs = []
    for _ in range(12):
        x = torch.randint(3, 90, (1, 6), generator=g)
        with torch.no_grad():
            seqs.append(m.generate(x, max_new_tokens=58, min_new_tokens=58, do_sample=False, pad_token_id=0)[0])
    return m, {**TINY, "architectures": ["LlamaForCausalLM"]}, seqs


def test_training_lowers_the_loss_and_exports_what_sglang_loads(target, tmp_path: Path) -> None:
    m, cfg, seqs = target
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=120, anchors_per_seq=8, lr=3e-3,
                                       seed=0, log=lambda *_: None)
    assert report["loss_last"] < report["loss_first"] - 0.5, report
    assert report["offline"]["accept_length"] >= 1.0 and report["offline"]["blocks"] > 0
    out = dflash_train.export(model, cfg, tmp_path / "d", report)
    dcfg = json.loads((out / "config.json").read_text())
    info = drafter.check(cfg, dcfg, block_size=8)
    assert info.target_layer_ids == (1, 2) and dcfg["architectures"] == ["DFlashDraftModel"]
    from safetensors.torch import load_file

    sd = load_file(str(out / "model.safetensors"))
    want = {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.input_layernorm.weight",
            "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
            "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight",
            "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight"}
    assert set(sd) == want, set(sd) ^ want
    assert sd["fc.weight"].shape == (64, 2 * 64) and all(v.dtype == torch.bfloat16 for v in sd.values())
    again = dflash_train.DFlashDrafter(model.s)
    again.load_state_dict({k: v.float() for k, v in sd.items()})
    feats = dflash_train._features(m, seqs[0], [1, 2]).float()
    e = m.get_input_embeddings()(torch.full((2, 8), 95)).float()
    a = torch.tensor([10, 20])
    with torch.no_grad():
        assert torch.allclose(model(feats, e, a), again(feats, e, a), atol=0.05)


def test_the_context_is_only_what_came_before_the_block(target) -> None:
    m, cfg, seqs = target
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=1, n_features=2))
    feats = dflash_train._features(m, seqs[0], [1, 2]).float()
    e = m.get_input_embeddings()(torch.full((1, 8), 95)).float()
    anchor = torch.tensor([20])
    changed = feats.clone()
    changed[25:] += 3.0  # features after the anchor must not matter
    with torch.no_grad():
        assert torch.allclose(model(feats, e, anchor), model(changed, e, anchor))
        changed[5] += 3.0  # a feature before it must
        assert not torch.allclose(model(feats, e, anchor), model(changed, e, anchor))


class _ChatTok:
    """A chat tokenizer stand-in for the tiny target: one id per character (3..89), eos 2."""

    eos_token_id = 2
    pad_token_id = 0

    def apply_chat_template(self, conv, add_generation_prompt=True):
        return [1] + [3 + (ord(c) % 87) for c in conv[0]["content"]]


def test_batched_self_distillation_is_each_prompt_generated_alone(target) -> None:
    m, _, _ = target
    tok = _ChatTok()
    seqs = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3)
    prompts = dflash_train.corpus_prompts(8)
    assert len(seqs) == 8 and len(set(prompts)) == 8
    for i in (0, 4):  # the greedy group (i % 4 == 0): batching and padding must not change a token
        ids = tok.apply_chat_template([{"role": "user", "content": prompts[i]}])
        with torch.no_grad():
            alone = m.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
        if 2 in alone[len(ids):]:
            alone = alone[: len(ids) + alone[len(ids):].index(2) + 1]
        assert seqs[i].tolist() == alone
    for s, p in zip(seqs, prompts, strict=True):  # every sequence starts with its own prompt, no padding
        ids = tok.apply_chat_template([{"role": "user", "content": p}])
        assert s.tolist()[: len(ids)] == ids and len(s) <= len(ids) + 12
