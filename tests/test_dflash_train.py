"""The DFlash drafter trainer (models/dflash_train.py) on CPU with a tiny random target: the loss
falls on target-written text, the export has the layout and config sglang's DFlashDraftModel
loads (checked against the target), and it reloads to the same outputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from testbed.models import dflash_train, drafter  # noqa: E402

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
    for s, p, n in zip(seqs, prompts, seqs.prompt_lens, strict=True):  # each starts with its own prompt, no padding
        ids = tok.apply_chat_template([{"role": "user", "content": p}])
        assert s.tolist()[: len(ids)] == ids and len(s) <= len(ids) + 12 and n == len(ids)


# ------------------------------------------------------------- what sglang 0.5.23 serves, rule by rule
# Each rule below is written here; where sglang's sources are unpacked at /tmp/sitetest (a reference
# copy, read-only) the test also reads the rule from them, so a new sglang that changes it fails here.

SGLANG = Path("/tmp/sitetest/sglang/srt")


def _sglang_text(rel: str) -> str | None:
    f = SGLANG / rel
    return f.read_text() if f.is_file() else None


def test_features_are_the_residual_stream_sglang_captures(target) -> None:
    """sglang's Llama captures, for target layer id i, the residual stream entering layer i + 1
    (set_dflash_layers_to_capture: layers_to_capture = [id + 1 ...]), in layer order."""
    m, _, seqs = target
    offset = 1
    src = _sglang_text("models/llama.py")
    if src is not None:
        body = src[src.index("def set_dflash_layers_to_capture"):]
        body = body[: body.index("\n\n\n")]
        assert "self.model.layers_to_capture = [val + 1 for val in layer_ids]" in body, body
    entering: list[torch.Tensor] = []
    hooks = [layer.register_forward_pre_hook(
        lambda mod, args, kw: entering.append((args[0] if args else kw["hidden_states"])[0].clone()),
        with_kwargs=True) for layer in m.model.layers]
    try:
        with torch.no_grad():
            feats = dflash_train._features(m, seqs[0], [0, 1, 2])
    finally:
        for h in hooks:
            h.remove()
    want = torch.cat([entering[i + offset] for i in (0, 1, 2)], dim=-1)
    assert torch.allclose(feats, want)
    for bad in ([3], [2, 1]):  # the last layer's output is never captured; features come in layer order
        with pytest.raises(ValueError):
            dflash_train._features(m, seqs[0], bad)
        cfg = drafter.drafter_config_for(TINY, block_size=8)
        cfg["dflash_config"]["target_layer_ids"] = bad
        with pytest.raises(Exception, match="sglang"):
            drafter.check(TINY, cfg, block_size=8)


_STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]


def _sglang_params(layers: int) -> set[str]:
    """DFlashDraftModel's parameters for a plain (no conv / selector / domino / sink) config."""
    per = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.qkv_proj.weight",
           "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
           "mlp.gate_up_proj.weight", "mlp.down_proj.weight"]
    return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{p}" for i in range(layers) for p in per}


def test_every_parameter_sglang_loads_comes_from_the_export(target, tmp_path: Path) -> None:
    """DFlashDraftModel.load_weights silently skips a name it cannot resolve, leaving that
    parameter at its init value: map the exported names the way it does and require every one of
    its parameters (each shard of the fused qkv / gate_up) to be written, with the right shape."""
    _, cfg, _ = target
    stacked = _STACKED
    src = _sglang_text("models/dflash.py")
    if src is not None:
        import re

        body = src[src.index("def load_weights"):]
        body = body[: body.index("params_dict = dict(")]
        stacked = [(a, b, int(c) if c.isdigit() else c.strip("\"'"))
                   for a, b, c in re.findall(r'\("(\w+)", "(\w+)", ("?\w+"?)\)', body)]
        assert stacked == _STACKED, stacked
        for needle in ('self.fc = nn.Linear(', 'self.hidden_norm = norm_cls(', 'self.norm = norm_cls(',
                       'self.q_norm = norm_cls(', 'self.k_norm = norm_cls(', 'self.input_layernorm = norm_cls(',
                       'self.post_attention_layernorm = norm_cls(', 'self.gate_up_proj = MergedColumnParallelLinear(',
                       'self.down_proj = RowParallelLinear(', 'self.o_proj = RowParallelLinear('):
            assert needle in src, needle
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=2, n_features=2))
    out = dflash_train.export(model, cfg, tmp_path / "d", {"block_size": 8, "layers": 2, "target_layer_ids": [1, 2]})
    from safetensors.torch import load_file

    sd = load_file(str(out / "model.safetensors"))
    params = _sglang_params(2)
    loaded: dict[str, set] = {}
    for name in sd:
        for param, weight, shard in stacked:
            if f".{weight}." in name:
                mapped = name.replace(weight, param)
                assert mapped in params, f"{name} -> {mapped}: sglang skips it"
                loaded.setdefault(mapped, set()).add(shard)
                break
        else:
            assert name in params, f"{name}: sglang skips it"
            loaded.setdefault(name, set()).add(None)
    assert set(loaded) == params, params ^ set(loaded)
    for i in range(2):
        assert loaded[f"layers.{i}.self_attn.qkv_proj.weight"] == {"q", "k", "v"}
        assert loaded[f"layers.{i}.mlp.gate_up_proj.weight"] == {0, 1}
    h, hd, heads, kv = TINY["hidden_size"], TINY["head_dim"], TINY["num_attention_heads"], TINY["num_key_value_heads"]
    assert sd["fc.weight"].shape == (h, 2 * h) and sd["layers.1.self_attn.k_norm.weight"].shape == (hd,)
    assert sd["layers.0.self_attn.q_proj.weight"].shape == (heads * hd, h)
    assert sd["layers.0.self_attn.v_proj.weight"].shape == (kv * hd, h)
    dcfg = json.loads((out / "config.json").read_text())
    # a plain DFLASH draft: no per-layer attention types (they would make sglang's draft layers
    # causal or windowed), no extras that add parameters the export does not have
    assert "layer_types" not in dcfg and "is_causal" not in dcfg and "use_gemma_norm" not in dcfg
    assert not set(dcfg["dflash_config"]) & {"conv_kernel_size", "selector_rank", "projector_type",
                                             "attention_sink_bias", "attention_value_scale"}


def test_blocks_are_anchored_only_where_sglang_drafts_them(target, monkeypatch) -> None:
    """After the prefill of a p-token prompt sglang's first block sits at position p (its token 0
    is the target's first answer token) and later ones further on: no block is anchored inside
    the prompt. Training and the offline acceptance use the same anchors."""
    m, cfg, seqs = target
    p, B = 20, 8
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=1, n_features=2))
    embed, head = m.get_input_embeddings(), m.get_output_embeddings()
    feats = [dflash_train._features(m, s, [1, 2]).float() for s in seqs[:3]]
    seen: list[torch.Tensor] = []
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda f, e, a: (seen.append(a.clone()), real_forward(f, e, a))[1])
    acc = dflash_train.offline_acceptance(model, feats, seqs[:3], embed, head, B, 95, prompt_lens=[p] * 3)
    assert acc["blocks"] == sum(len(range(p, s.shape[0] - B, 3)) for s in seqs[:3])
    assert all(int(a.min()) == p for a in seen)
    seen.clear()
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        dflash_train._block_loss(model, feats[0], seqs[0], embed, head, B, 95, 64, rng, lo=p)
    assert int(seen[0].min()) >= p and int(seen[0].max()) < seqs[0].shape[0] - B

    los: list[int] = []
    real_draw = dflash_train._draw_blocks
    monkeypatch.setattr(dflash_train, "_draw_blocks", lambda *a: (los.append(a[-1]), real_draw(*a))[1])
    corpus = dflash_train.Corpus(seqs, [p] * len(seqs))
    _, report = dflash_train.train(m, corpus, cfg, block=B, layers=1, steps=2, anchors_per_seq=4, seed=0,
                                   log=lambda *_: None)
    assert los and set(los) == {p}
    assert report["offline"]["blocks"] == len(range(p, seqs[0].shape[0] - B, 3))  # one held-out sequence
    assert "accept_length_all_anchors" in report["offline"]


def test_corpus_prompts_are_distinct_and_refuse_more_than_the_pool() -> None:
    pool = dflash_train.prompt_pool()
    assert len(set(pool)) == len(pool) >= 2400  # no prompt twice (the fixed poem prompt was also a task)
    assert dflash_train.corpus_prompts(len(pool)) == pool
    for n in (0, len(pool) + 1):
        with pytest.raises(ValueError, match="distinct prompts"):
            dflash_train.corpus_prompts(n)


def test_the_pool_holds_out_the_gates_suite_and_mixes_every_kind_of_request() -> None:
    """The gate's suite prompts are measured on, never trained on: no corpus prompt contains one, up to case and
    punctuation (the old pool asked the suite's poem verbatim, and its T=0 answer was a training sequence). Every
    kind of request (prose, code, tables, lists, sums, facts, guides) is in any first 7 x 12 prompts."""
    held = dflash_train.held_out_prompts()
    assert len(held) >= 8 and "Write a short poem about the ocean." in held
    norm = dflash_train._norm
    pool = dflash_train.prompt_pool()
    leaks = [p for p in pool for h in held if norm(h) in norm(p)]
    assert leaks == []
    kinds = dflash_train._pool_kinds()
    assert any(norm(held[0]) in norm(p) for p in kinds[0]), "the filter has something to remove"
    first = set(pool[: 7 * 12])
    for kind in kinds:
        assert first & set(kind), kind[:2]
    assert "Write a JavaScript function that reverses a list." in pool
    assert "What is 12 plus 30? Reply with the number and one short sentence." not in pool


class _CharTokenizer:
    """Enough of a tokenizer for the tiny target: a chat prompt's characters as ids 3..89, end of sequence 2."""
    eos_token_id = 2
    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return [3 + ord(c) % 87 for c in messages[-1]["content"]][:24]


def test_the_suite_corpus_is_the_targets_greedy_answers_within_each_prompts_budget(target) -> None:
    m, cfg, seqs = target
    suite = dflash_train.suite_corpus(m, _CharTokenizer(), device="cpu", max_new=40)
    entries = dflash_train._suite_entries()
    assert len(suite) == len(entries) == len(suite.prompt_lens)
    for e, seq, pl in zip(entries, suite, suite.prompt_lens, strict=True):
        assert pl == min(24, len(e["prompt"])) and 0 < seq.shape[0] - pl <= min(40, e["max_tokens"])
    again = dflash_train.suite_corpus(m, _CharTokenizer(), device="cpu", max_new=40)
    assert all(torch.equal(a, b) for a, b in zip(suite, again, strict=True)), "greedy: the same answers"
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=3, anchors_per_seq=4, seed=0,
                                       log=lambda *_: None)
    acc = dflash_train.suite_acceptance(model, m, suite, report["target_layer_ids"], 8, report["mask_token_id"])
    assert acc["blocks"] > 0 and 1.0 <= acc["accept_length"] <= 8.0


@pytest.mark.parametrize("flag", [["--seqs", "1"], ["--seqs", "999999"], ["--seqs-per-step", "0"], ["--anchors", "0"],
                                  ["--lr", "0"], ["--gen-batch", "0"], ["--steps", "0"],
                                  ["--max-seconds", "0"], ["--position-decay", "-1"], ["--checks", "0"],
                                  ["--answers-per-prompt", "0"], ["--answers-per-prompt", "5"],
                                  ["--base-corpus", "x.pt"], ["--self-asked", "-1"]])
def test_train_drafter_refuses_bad_numbers_before_loading_anything(flag, tmp_path, capsys) -> None:
    from testbed.models.__main__ import main

    rc = main(["train-drafter", "--target", str(tmp_path / "none"), "--out", str(tmp_path / "o"), *flag])
    assert rc == 2 and "out of range" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_deadline_cuts_the_steps_to_what_fits_and_the_drafter_still_comes_back(target) -> None:
    """train(deadline=...): after 10 timed steps the count is cut to what ends by the deadline (here one already
    past: the minimum, 11 steps), the cut recorded beside the planned count."""
    import time

    m, cfg, seqs = target
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=500, anchors_per_seq=8, seed=0,
                                       log=lambda *_: None, deadline=time.time() - 1)
    assert report["steps"] == 11 and report["steps_planned"] == 500
    assert report["offline"]["blocks"] > 0 and isinstance(model, dflash_train.DFlashDrafter)
    _, full = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=20, anchors_per_seq=8, seed=0,
                                 log=lambda *_: None, deadline=time.time() + 3600)
    assert full["steps"] == full["steps_planned"] == 20  # a deadline far off cuts nothing


def test_the_step_time_that_fits_the_deadline_leaves_out_the_first_steps_warm_up(target, monkeypatch) -> None:
    """The first step carries the CUDA warm-up (1 s on the H100 against 16 ms a step, 2026-12-07): timed with it,
    the step count was cut to a fifth of what fitted. A clock that only moves at the first step (100 s) and by a
    millisecond per reading: the steps after it cost nothing, so the planned count stands."""
    import types

    m, cfg, seqs = target
    now = [1000.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    def log(msg: str) -> None:
        if "step 0/" in msg:
            now[0] += 100.0  # the first step's warm-up

    monkeypatch.setattr(dflash_train, "time", types.SimpleNamespace(time=clock))
    _, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=150, anchors_per_seq=4, seed=0,
                                   log=log, deadline=now[0] + 30 + 500, checks=2)
    assert report["steps"] == report["steps_planned"] == 150
    now[0] = 1000.0
    _, cut = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=150, anchors_per_seq=4, seed=0,
                                log=log, deadline=now[0] + 100 + 30 - 1, checks=2)
    assert cut["steps"] == 11 and cut["steps_planned"] == 150  # a deadline nothing fits: the minimum


def test_the_drafter_returned_is_the_one_at_the_lowest_validation_loss(target) -> None:
    """A learning rate that wrecks the drafter after its first steps: the one returned is the checked state with the
    lowest loss on the validation sequences (kept out of training and of the held-out tenth), not the last."""
    m, cfg, seqs = target
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=40, anchors_per_seq=8, seed=0,
                                       lr=3.0, log=lambda *_: None, checks=8)
    losses = [c["loss"] for c in report["validation"]]
    assert len(losses) >= 9 and report["validation"][-1]["step"] == 40
    best = min(range(len(losses)), key=losses.__getitem__)
    assert report["kept_step"] == report["validation"][best]["step"] < 40 and losses[best] < losses[-1]
    train_idx, held, val = dflash_train.split_sets(list(range(len(seqs))), len(seqs))
    assert report["validation_seqs"] == len(val) >= 1 and not set(val) & set(train_idx) and not set(val) & set(held)
    layer_ids, mask_id = report["target_layer_ids"], report["mask_token_id"]
    with torch.no_grad():
        feats = [dflash_train._features(m, seqs[i], layer_ids).float() for i in val]
    again = dflash_train.validation_loss(model, feats, [seqs[i] for i in val], m.get_input_embeddings(),
                                         m.get_output_embeddings(), 8, mask_id, 8, 0 + 7919, [1] * len(val),
                                         dflash_train.position_weights(8, 0.0))
    assert again == pytest.approx(losses[best], rel=1e-4)


def test_validation_checks_come_early_then_evenly() -> None:
    """A long run checks within its first thousand steps (where a small corpus's best drafter can be), never further
    apart than steps // checks, and a short run's checks stay evenly spread."""
    at, got = 0, []
    while at < 24_587:
        got.append(at)
        at = dflash_train.next_check_after(at, 24_587, 20)
    assert got[:5] == [0, 250, 500, 750, 1125] and len([g for g in got if g < 3000]) >= 6
    assert max(b - a for a, b in itertools.pairwise(got)) == 24_587 // 20 and len(got) <= 40
    assert [dflash_train.next_check_after(s, 40, 8) for s in (0, 5, 35)] == [5, 10, 40]


def test_position_weights_favour_the_early_positions_and_keep_the_loss_scale() -> None:
    w = dflash_train.position_weights(8, 4.0)
    assert w.shape == (7,) and torch.all(w[:-1] > w[1:]) and abs(float(w.mean()) - 1) < 1e-6
    assert float(w[0] / w[1]) == pytest.approx(float(torch.exp(torch.tensor(0.25))), rel=1e-5)
    assert torch.equal(dflash_train.position_weights(8, 0.0), torch.ones(7))


def test_a_weighted_loss_is_the_weighted_mean_of_the_positions_losses(target) -> None:
    m, cfg, seqs = target
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=1, n_features=2))
    feats = dflash_train._features(m, seqs[0], [1, 2]).float()
    embed, head = m.get_input_embeddings(), m.get_output_embeddings()

    def loss(w):
        return dflash_train._block_loss(model, feats, seqs[0], embed, head, 8, 95, 6, torch.Generator().manual_seed(3),
                                        weights=w)

    one_hot = torch.zeros(7)
    one_hot[0] = 7.0  # all the weight on position 1
    flat, first = loss(None), loss(one_hot)
    assert torch.allclose(loss(torch.ones(7)), flat)
    assert not torch.allclose(first, flat)
    with pytest.raises(ValueError, match="position_decay"):
        dflash_train.train(m, seqs, cfg, block=8, steps=1, position_decay=-1.0, log=lambda *_: None)


def test_init_from_target_copies_the_targets_last_layers(target) -> None:
    m, cfg, seqs = target
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=2, steps=1, lr=1e-12, seed=0,
                                       init_from_target=True, log=lambda *_: None)
    assert report["init_from_target"] is True
    last = list(m.model.layers)[-2:]
    for dst, src in zip(model.layers, last, strict=True):
        for n in ("self_attn.q_proj", "mlp.down_proj", "input_layernorm"):
            assert torch.allclose(dst.get_submodule(n).weight, src.get_submodule(n).weight, atol=1e-6), n
        assert torch.allclose(dst.self_attn.q_norm.weight, torch.ones_like(dst.self_attn.q_norm.weight))


def test_features_in_batches_are_each_sequences_own(target) -> None:
    """features_of (right-padded batches in order of length) gives each sequence, in the order given, what
    _features gives it alone."""
    m, _, seqs = target
    mixed = [seqs[0][:20], seqs[1], seqs[2][:9], seqs[3][:41], seqs[4][:33]]
    with torch.no_grad():
        alone = [dflash_train._features(m, x, [1, 2]).float() for x in mixed]
        got = dflash_train.features_of(m, mixed, [1, 2], batch=2)
    assert [g.shape for g in got] == [a.shape for a in alone]
    for g, a in zip(got, alone, strict=True):
        assert torch.allclose(g, a, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="target_layer_ids"):
        dflash_train.features_of(m, mixed, [3], batch=2)


def test_several_answers_per_prompt_are_the_one_answer_corpus_and_more_at_other_temperatures(target) -> None:
    """answers=2: the first answers are the one-answer corpus's text; the second answer to each prompt is written
    at the next temperature (so a greedy prompt's second answer is sampled and a sampled one's may be greedy), and
    every sequence knows its prompt."""
    m, _, _ = target
    tok = _ChatTok()
    one = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3)
    two = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3, answers=2)
    assert len(two) == 16 and two.prompts == list(range(8)) * 2 and two.n_prompts == 8
    assert [x.tolist() for x in two[:8]] == [x.tolist() for x in one] and two.prompt_lens[:8] == one.prompt_lens
    assert two.prompt_lens[8:] == one.prompt_lens  # the same prompts again
    # prompt 3 is sampled (T 1.0) in its first answer and greedy (T 0, the next temperature) in its second
    ids = tok.apply_chat_template([{"role": "user", "content": dflash_train.corpus_prompts(8)[3]}])
    with torch.no_grad():
        alone = m.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    if 2 in alone[len(ids):]:
        alone = alone[: len(ids) + alone[len(ids):].index(2) + 1]
    assert two[8 + 3].tolist() == alone
    with pytest.raises(ValueError, match="answers 5"):
        dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", answers=5)


def test_more_answers_on_a_base_corpus_keep_its_answers_and_write_only_the_rest(target, tmp_path: Path) -> None:
    """base=: the answers of a corpus with fewer per prompt are kept (not written again) and the rest are what a
    corpus written whole has; a base of another shape, or a file of another recipe, is refused."""
    m, _, _ = target
    tok = _ChatTok()
    one = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3)
    whole = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3, answers=2)
    grown = dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", batch=3, answers=2,
                                             base=one)
    assert all(g is o for g, o in zip(grown[:8], one, strict=True))  # kept, not written again
    assert [x.tolist() for x in grown] == [x.tolist() for x in whole] and grown.prompts == whole.prompts
    with pytest.raises(ValueError, match="base corpus"):
        dflash_train.self_distill_corpus(m, tok, n=8, max_new=12, seed=0, device="cpu", answers=2, base=whole)
    meta1 = dflash_train.corpus_meta(TINY, n=8, max_new=12, seed=0)
    f = dflash_train.save_corpus(one, tmp_path / "one.pt", meta1)
    meta3 = dflash_train.corpus_meta(TINY, n=8, max_new=12, seed=0, answers=3)
    assert len(dflash_train.load_fewer_answers(f, meta3)) == 8
    for other in (meta1, dflash_train.corpus_meta(TINY, n=8, max_new=12, seed=1, answers=3)):
        with pytest.raises(ValueError, match="not a corpus of this recipe"):
            dflash_train.load_fewer_answers(f, other)


class _TemplateTok(_ChatTok):
    """A stand-in with a chat template's user-turn prefix ([1, 5, 6]), an end-of-turn eos (2) and a decoder: ids
    that are multiples of 4 read as spaces, so sampled rows have words."""

    def apply_chat_template(self, conv, add_generation_prompt=True):
        return [1, 5, 6] + [3 + (ord(c) % 87) for c in conv[0]["content"]] + [2]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(" " if i % 4 == 0 else chr(ord("a") + i % 26) for i in ids if i > 2)


def test_self_asked_prompts_are_the_targets_own_distinct_and_never_the_suites(target, monkeypatch) -> None:
    """The target asks from its user turn; each kept request ended, has 3 to 60 words, is unlike every other and
    every excluded one, and is neither inside nor around a held-out suite prompt; too few that end is an error."""
    m, _, _ = target
    tok = _TemplateTok()
    asked = dflash_train.self_asked_prompts(m, tok, 12, seed=0, device="cpu", exclude=[], batch=16, max_new=24)
    keys = [dflash_train._norm(p) for p in asked]
    assert len(asked) == 12 and len(set(keys)) == 12 and all(3 <= len(p.split()) <= 60 for p in asked)
    assert asked == dflash_train.self_asked_prompts(m, tok, 12, seed=0, device="cpu", exclude=[], batch=16,
                                                    max_new=24)  # the seed decides
    # one becomes a suite prompt (seen inside a longer one), another an excluded pool prompt: both go, n still come
    monkeypatch.setattr(dflash_train, "held_out_prompts", lambda: [f"Please: {asked[0].upper()}, thanks."])
    again = dflash_train.self_asked_prompts(m, tok, 12, seed=0, device="cpu", exclude=[asked[1] + "!"], batch=16,
                                            max_new=24)
    assert len(again) == 12 and asked[0] not in again and asked[1] not in again and again[:10] == asked[2:12]
    with pytest.raises(ValueError, match="kept from"):  # one token a request: none ends as a whole request
        dflash_train.self_asked_prompts(m, tok, 2, seed=0, device="cpu", exclude=[], batch=8, max_new=1)
    stats: dict[str, int] = {}
    dflash_train.self_asked_prompts(m, tok, 12, seed=0, device="cpu", exclude=[asked[1]], batch=16, max_new=24,
                                    stats=stats)
    assert stats["kept"] == 12 and stats["dropped_suite"] >= 1 and stats["dropped_duplicate"] >= 1
    assert stats["requests"] >= 12 + sum(v for k, v in stats.items() if k.startswith("dropped_"))


def test_the_self_asked_sample_counts_kinds_drops_and_the_corpus_checks() -> None:
    """bench/self_asked.py's summary: keep rate over the requests examined, and the two checks it reports (a pool
    prompt or one around a suite prompt among the kept) count what is there."""
    from bench.self_asked import kind_of, summary

    pool, held = ["Write a poem about the sea."], ["Tell me a joke about cats."]
    kept = ["Can you write a Python function to sort a list?", "write a POEM about the sea",
            "Please, tell me a joke about cats today", "How do volcanoes form?"]
    s = summary(kept, {"requests": 10, "kept": 4, "dropped_cut_off": 3, "dropped_length": 1}, pool, held)
    assert s["examined"] == 8 and s["keep_rate"] == 0.5 and s["in_pool"] == 1 and s["around_suite"] == 1
    assert s["kinds"]["code"] == 1 and kind_of("How do volcanoes form?") == "question" and s["distinct"] == 4


def test_self_asked_prompts_extend_a_corpus_that_keeps_the_pool_prompts_answers(target, tmp_path: Path) -> None:
    """prompts=: the pool's prompts then the asked ones; a base answering the pool's prompts alone is kept (not
    written again) and only the new prompts are answered; the meta names the asked prompts, and a base of the pool
    alone loads for it."""
    m, _, _ = target
    tok = _ChatTok()
    pool = dflash_train.corpus_prompts(4)
    one = dflash_train.self_distill_corpus(m, tok, n=4, max_new=12, seed=0, device="cpu", batch=3)
    prompts = [*pool, "how do kites fly", "name three rivers"]
    grown = dflash_train.self_distill_corpus(m, tok, n=6, max_new=12, seed=0, device="cpu", batch=3, base=one,
                                             prompts=prompts)
    assert len(grown) == 6 and grown.n_prompts == 6 and grown.prompts == list(range(6))
    assert all(g is o for g, o in zip(grown[:4], one, strict=True))
    ids = tok.apply_chat_template([{"role": "user", "content": prompts[4]}])  # prompt 4: greedy (4 % 4 == 0)
    with torch.no_grad():
        alone = m.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    if 2 in alone[len(ids):]:
        alone = alone[: len(ids) + alone[len(ids):].index(2) + 1]
    assert grown[4].tolist() == alone and grown.prompt_lens[4] == len(ids)
    two = dflash_train.self_distill_corpus(m, tok, n=6, max_new=12, seed=0, device="cpu", batch=3, base=one,
                                           prompts=prompts, answers=2)  # the pool's second answers are written too
    assert len(two) == 12 and all(g is o for g, o in zip(two[:4], one, strict=True)) and two.prompts[6:] == list(
        range(6))
    with pytest.raises(ValueError, match="prompts for a corpus"):
        dflash_train.self_distill_corpus(m, tok, n=5, max_new=12, seed=0, device="cpu", prompts=prompts)
    meta = dflash_train.corpus_meta(TINY, n=4, max_new=12, seed=0, self_asked=2)
    assert meta["self_asked"] == 2 and "self_asked" not in dflash_train.corpus_meta(TINY, n=4, max_new=12, seed=0)
    f = dflash_train.save_corpus(one, tmp_path / "pool.pt", dflash_train.corpus_meta(TINY, n=4, max_new=12, seed=0))
    assert len(dflash_train.load_fewer_answers(f, meta)) == 4
    g = dflash_train.save_corpus(grown, tmp_path / "grown.pt", meta)
    with pytest.raises(ValueError, match="not a corpus of this recipe"):  # the same recipe is no base of itself
        dflash_train.load_fewer_answers(g, meta)
    # the sampled prompts' words travel with a self-asked corpus (more answers later answer the same prompts)
    assert dflash_train.load_corpus(g, meta).texts == prompts and grown.texts == prompts
    assert dflash_train.load_fewer_answers(g, {**meta, "answers": 2}).texts == prompts
    assert dflash_train.load_corpus(f, dflash_train.corpus_meta(TINY, n=4, max_new=12, seed=0)).texts is None
    assert not dflash_train.same_held_out(meta, dflash_train.corpus_meta(TINY, n=4, max_new=12, seed=0))


def test_the_split_is_by_prompt_so_no_prompts_answers_straddle_two_sets() -> None:
    groups = [g for _ in range(3) for g in range(60)]  # three answers to each of 60 prompts
    train, held, val = dflash_train.split_sets(groups, 60)
    by = {name: {groups[i] for i in idx} for name, idx in (("train", train), ("held", held), ("val", val))}
    assert by["held"] == set(range(6)) and len(held) == 18  # the first tenth of the prompts, all their answers
    assert by["val"] == {6, 26, 46} and len(val) == 9
    assert not (by["train"] & by["held"]) and not (by["train"] & by["val"]) and not (by["held"] & by["val"])
    assert sorted(train + held + val) == list(range(180))
    # a drafter trained on one corpus goes on with more answers to the same prompts, never with other prompts
    meta = dflash_train.corpus_meta(TINY, n=60, max_new=12, seed=0)
    assert "answers" not in meta and dflash_train.same_held_out(meta, {**meta, "answers": 3, "seed": 5})
    assert not dflash_train.same_held_out(meta, dflash_train.corpus_meta(TINY, n=70, max_new=12, seed=0))
    assert dflash_train.same_held_out(None, meta)


def test_a_corpus_of_several_answers_keeps_its_prompts_through_a_file(tmp_path: Path) -> None:
    seqs = dflash_train.Corpus([torch.arange(5, 17), torch.arange(40, 49), torch.arange(7, 19)], [4, 2, 4],
                               [0, 1, 0], 2)
    meta = dflash_train.corpus_meta(TINY, n=2, max_new=12, seed=0, answers=2)
    back = dflash_train.load_corpus(dflash_train.save_corpus(seqs, tmp_path / "corpus.pt", meta), meta)
    assert back.prompts == [0, 1, 0] and back.n_prompts == 2 and back.prompt_lens == [4, 2, 4]
    with pytest.raises(ValueError, match="prompt index"):
        dflash_train.Corpus([torch.arange(3)], [1], [2], 2)


def test_a_saved_corpus_comes_back_whole_and_only_for_its_own_recipe(tmp_path: Path) -> None:
    seqs = dflash_train.Corpus([torch.arange(5, 17), torch.arange(40, 49), torch.tensor([3, 4, 5, 6])], [4, 2, 1])
    meta = dflash_train.corpus_meta(TINY, n=3, max_new=12, seed=0)
    path = dflash_train.save_corpus(seqs, tmp_path / "c" / "corpus.pt", meta)
    back = dflash_train.load_corpus(path, meta)
    assert [x.tolist() for x in back] == [x.tolist() for x in seqs] and back.prompt_lens == [4, 2, 1]
    assert all(x.dtype == torch.long for x in back)
    for other in (dflash_train.corpus_meta(TINY, n=3, max_new=12, seed=1),
                  dflash_train.corpus_meta({**TINY, "hidden_size": 32}, n=3, max_new=12, seed=0)):
        with pytest.raises(ValueError, match="another recipe or target"):
            dflash_train.load_corpus(path, other)


def test_training_goes_on_from_an_exported_drafter(target, tmp_path: Path) -> None:
    """--resume: the exported drafter's weights are where the next call starts (its first loss is the first call's
    last, not a fresh drafter's), the steps add up, and a drafter of another shape is refused."""
    m, cfg, seqs = target
    model, first = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=120, anchors_per_seq=8, lr=3e-3,
                                      seed=0, log=lambda *_: None)
    out = dflash_train.export(model, cfg, tmp_path / "d", first)
    state, prior = dflash_train.load_drafter(out)
    _, fresh = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=20, anchors_per_seq=8, lr=1e-4, seed=1,
                                  log=lambda *_: None)
    _, again = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=20, anchors_per_seq=8, lr=1e-4, seed=1,
                                  log=lambda *_: None, init_state=state, prior=prior)
    assert again["loss_first"] < fresh["loss_first"] - 0.5, (again["loss_first"], fresh["loss_first"])
    assert abs(again["loss_first"] - first["loss_last"]) < 0.5 * first["loss_last"]
    assert again["steps_total"] == 140 and again["resumed_from"]["steps"] == 120 and fresh["steps_total"] == 20
    with pytest.raises(ValueError, match="another shape"):
        dflash_train.train(m, seqs, cfg, block=8, layers=2, steps=2, anchors_per_seq=8, seed=0,
                           log=lambda *_: None, init_state=state, prior=prior)
    with pytest.raises(ValueError, match="not a drafter"):
        dflash_train.load_drafter(tmp_path / "nothing")


def test_train_drafter_refuses_a_drafter_it_cannot_go_on_with(target, tmp_path: Path, capsys) -> None:
    from testbed.models.__main__ import main

    m, cfg, seqs = target
    model, report = dflash_train.train(m, seqs, cfg, block=8, layers=1, steps=2, anchors_per_seq=8, seed=0,
                                       log=lambda *_: None)
    d = dflash_train.export(model, cfg, tmp_path / "d", report)
    tdir = tmp_path / "t"
    tdir.mkdir()
    (tdir / "config.json").write_text(json.dumps(cfg))
    args = ["train-drafter", "--target", str(tdir), "--out", str(tmp_path / "o"), "--device", "cpu"]
    assert main([*args, "--resume", str(tmp_path / "none")]) == 2
    assert "not a drafter" in capsys.readouterr().err
    assert main([*args, "--resume", str(d), "--layers", "2"]) == 2
    assert "1 layer(s)" in capsys.readouterr().err
    assert main([*args, "--resume", str(d), "--init-from-target"]) == 2
    assert "one of them" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# SmolLM2-135M-Instruct's shape as corpus_meta records it (the embedded target; its config.json on the Hub)
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9)
TRACKED_CORPUS = dflash_train.TRACKED_CORPUS


def test_the_tracked_corpus_is_the_default_recipes_and_whole() -> None:
    """The target-written corpus kept in the tree for the device's training calls (gpu_session.sh corpus_in) loads
    for exactly the default recipe (2,400 prompts, 256 new tokens, seed 0, SmolLM2's shape), and each sequence is a
    distinct chat prompt (starting at <|im_start|>, id 1) followed by an answer of 1 to 256 tokens in the vocabulary."""
    meta = dflash_train.corpus_meta(SMOLLM2, n=2400, max_new=256, seed=0)
    corpus = dflash_train.load_corpus(TRACKED_CORPUS, meta)
    assert len(corpus) == 2400 == len(corpus.prompt_lens)
    prompts = set()
    for seq, p in zip(corpus, corpus.prompt_lens, strict=True):
        assert int(seq[0]) == 1 and 1 <= seq.shape[0] - p <= 256
        assert int(seq.min()) >= 0 and int(seq.max()) < SMOLLM2["vocab_size"]
        prompts.add(tuple(seq[:p].tolist()))
    assert len(prompts) == 2400
    with pytest.raises(ValueError, match="another recipe or target"):
        dflash_train.load_corpus(TRACKED_CORPUS, dflash_train.corpus_meta(SMOLLM2, n=2400, max_new=128, seed=0))


def test_the_packed_step_is_the_per_sequence_steps_mean(target) -> None:
    """Training's packed pass (all of a step's sequences at once, zero-padded to the longest) gives the mean of
    the per-sequence losses with the same anchors, and the same gradient: padding and the other sequences'
    blocks are invisible to every block. A mask that let blocks see each other, or the padding, fails it."""
    m, cfg, seqs = target
    torch.manual_seed(5)
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=2, n_features=2))
    embed, head = m.get_input_embeddings(), m.get_output_embeddings()
    texts = [seqs[0], seqs[1][:40], seqs[2][:52]]  # unequal lengths: the packed pass pads
    feats = [dflash_train._features(m, s, [1, 2]).float() for s in texts]
    los = [8, 3, 20]
    w = dflash_train.position_weights(8, 2.0)

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    rng = torch.Generator().manual_seed(11)
    per = sum(dflash_train._block_loss(model, f, s, embed, head, 8, 95, 6, rng, lo=lo, weights=w)
              for f, s, lo in zip(feats, texts, los, strict=True)) / 3
    g_per = grads(per)
    packed = dflash_train._packed_loss(model, feats, texts, embed, head, 8, 95, 6, torch.Generator().manual_seed(11),
                                       los, weights=w)
    g_packed = grads(packed)
    assert torch.allclose(per, packed, atol=1e-5), (float(per), float(packed))
    assert torch.allclose(g_per, g_packed, atol=1e-5, rtol=1e-4)
    # a block token that could see the other blocks of its sequence computes something else
    anchors = torch.tensor([[10, 20]])
    e = embed(torch.full((1, 2, 8), 95)).float()
    with torch.no_grad():
        alone = model(feats[0], e[0], anchors[0])
        together = model.forward_packed(feats[0].unsqueeze(0), e, anchors)[0]
        assert torch.allclose(alone, together, atol=1e-5)
        e2 = e.clone()
        e2[0, 1] += 1.0  # the second block's tokens change; the first block's output must not
        assert torch.allclose(model.forward_packed(feats[0].unsqueeze(0), e2, anchors)[0, 0], together[0], atol=1e-6)
