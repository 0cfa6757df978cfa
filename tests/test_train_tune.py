"""train-heads, tune-tree, tree --draw, --medusa_choices @FILE, verify's predicted tokens per step."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_base

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.files.prompts import (
    PromptInputs,
    heldout_prompts,
    packaged_prompts,
    verify_prompts,
)
from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS
from trtllm_medusa_ports.heads import load_heads
from trtllm_medusa_ports.heads.fit import FitOptions, fit_heads
from trtllm_medusa_ports.huggingface.model import final_hidden, lm_head_of, load_base
from trtllm_medusa_ports.trees.tree import MedusaTree, validate_choices
from trtllm_medusa_ports.trees.tune import (
    accepted_length,
    accuracy_table,
    build_tree,
    draw,
    expected_tokens_per_step,
    joint_values,
    measured_acceptance,
    rank_of_targets,
    rank_path,
)


# -- the hidden state and logits the heads train on -------------------------------------------
@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "PhiForCausalLM", "GPTNeoXForCausalLM", "BloomForCausalLM"])
def test_final_hidden_is_what_the_lm_head_sees(store, arch):
    """After the final norm: the base's logits are lm_head(hidden) (+ bias, Phi-2), then Gemma 2's
    final soft-capping - which the heads' logits never get (the engine applies it to the base only)."""
    model = load_base(tiny_base(store, arch))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    h = final_hidden(model, ids)
    w, b = lm_head_of(model)
    logits = h @ w.T + (b if b is not None else 0)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        assert not torch.allclose(logits, model(input_ids=ids).logits)  # capping matters here
        logits = torch.tanh(logits / cap) * cap
    assert torch.allclose(logits, model(input_ids=ids).logits, atol=1e-5)
    assert (b is not None) == (arch == "PhiForCausalLM")


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_the_corpus_states_taken_from_the_generation_are_those_of_a_pass_over_the_whole_sequence(store, arch,
                                                                                                monkeypatch):
    """build_shard keeps the final-norm states the greedy generation computed (left-padded, step by step, with the
    KV cache) instead of a second pass: for prompts of several lengths in one batch they are the states one pass
    over each whole sequence gives, position for position; a text item's come from that pass."""
    from trtllm_medusa_ports.files.prompts import Item
    from trtllm_medusa_ports.heads.corpus import build_shard

    model = load_base(tiny_base(store, arch))
    items = [Item([5, 9, 2], True), Item([7, 1, 8, 2, 8, 1, 8], True), Item([3, 4], True),
             Item([11, 12, 13, 14, 15, 16], False)]
    from trtllm_medusa_ports.heads import corpus as corpus_module

    passed = []
    monkeypatch.setattr(corpus_module, "final_hidden", lambda m, ids, mask: passed.append(ids.shape[0]) or
                        final_hidden(m, ids, mask))
    corpus = build_shard(model, items, 6, batch=3)
    # the text item alone: every continuation's states came from its generation (the lm_head's input at each call:
    # OPT's causal-LM class calls its decoder rather than its base model, transformers' MPT runs the whole sequence
    # at each call without a KV cache, and both still hand the lm_head one position a step); transformers 4.x
    # (TensorRT-LLM 1.2's pin) may call Gemma 3's and MPT's otherwise, and their states then come from the pass
    import transformers

    either = {"MptForCausalLM", "Gemma3ForCausalLM"} if transformers.__version__.startswith("4.") else set()
    assert passed in ([1], [3, 1]) if arch in either else passed == [1], passed
    assert corpus.index.shape[0] == corpus.hidden.shape[0] > 0
    for i, seq in enumerate(corpus.seqs):
        whole = final_hidden(model, torch.tensor([seq]))[0]
        at = corpus.index[:, 0] == i
        positions = corpus.index[at, 1]
        kept = len(seq) - corpus.starts[i] >= 3  # else nothing for a head to predict: no rows
        assert positions.tolist() == (list(range(corpus.starts[i], len(seq) - 1)) if kept else [])
        assert torch.allclose(corpus.hidden[at], whole[positions], atol=1e-4, rtol=1e-4), (arch, i)


def test_packaged_prompts_are_many_varied_and_disjoint_from_the_heldout_ones():
    train, held, checks = packaged_prompts(), heldout_prompts(), verify_prompts()
    assert len(train) >= 250 and len(set(train)) == len(train) and len(held) >= 250 and len(set(held)) == len(held)
    assert not set(train) & set(held)
    assert len(checks) == len(set(checks)) >= 12 and not set(checks) & (set(train) | set(held))
    assert any(p.startswith("def ") for p in train) and any("\n" in p for p in train)


def test_packaged_prompts_are_what_the_generator_writes(tmp_path):
    """data/prompts.txt is scripts/make_prompts.py's output: regenerate it after editing the script."""
    import runpy
    from importlib import resources

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_prompts.py"
    runpy.run_path(str(script), run_name="make_prompts")["main"](["--out", str(tmp_path / "p.txt"),
                                                                   "--tune_out", str(tmp_path / "t.txt"),
                                                                   "--verify_out", str(tmp_path / "v.txt")])
    data = resources.files("trtllm_medusa_ports").joinpath("data")
    packaged = data.joinpath("prompts.txt").read_text(encoding="utf-8")
    assert (tmp_path / "p.txt").read_text(encoding="utf-8") == packaged
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == data.joinpath("tune_prompts.txt").read_text(encoding="utf-8")
    assert (tmp_path / "v.txt").read_text(encoding="utf-8") == data.joinpath("verify_prompts.txt").read_text(
        encoding="utf-8")
    forms = {p.split(" ")[0] for p in packaged_prompts()}
    assert len(packaged_prompts()) >= 1500 and len(forms) >= 60  # many prompts, many shapes of prompt


def test_evaluation_subjects_stay_out_of_the_packaged_prompts():
    """benchmarks/real_model.py measures heads on prompts whose subjects no generated prompt names: every one of them
    holds a word of the generator's RESERVED list, and no generated training, tuning or verify prompt holds any."""
    import re
    import runpy

    root = Path(__file__).resolve().parents[1]
    reserved = runpy.run_path(str(root / "scripts" / "make_prompts.py"), run_name="make_prompts")["RESERVED"]
    bench = runpy.run_path(str(root / "benchmarks" / "real_model.py"), run_name="real_model")
    words = re.compile("|".join(re.escape(w) for w in reserved), re.IGNORECASE)
    unguarded = [p for p in bench["EVAL"] + bench["EVAL_MORE"] if not words.search(p)]
    assert not unguarded, f"evaluation prompts with no reserved word: {unguarded}"

    tuning = heldout_prompts()[30:]  # the 30 hand-written tuning prompts come first: their subjects are reserved
    leaked = [p for p in packaged_prompts() + tuning + verify_prompts() if words.search(p)]
    assert not leaked, leaked[:5]


# -- training -----------------------------------------------------------------------------------
def _toy(n=300, H=16, V=40, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g)
    lm = torch.randn(V, H, generator=g)
    targets = torch.randint(0, V, (n, heads), generator=g)
    targets[-3:, 1] = -1
    return hidden, targets, lm


@pytest.mark.parametrize("share", [True, False])
def test_resume_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, share):
    hidden, targets, lm = _toy()
    opts = FitOptions(num_heads=2, steps=12, lr=1e-2, batch_size=32, share_lm_head=share, save_every=5)
    straight, _ = fit_heads(hidden, targets, lm, None, opts)
    state = tmp_path / "state.pt"
    first, hist = fit_heads(hidden, targets, lm, None, opts, state_path=state, stop_after=7)
    assert hist[-1]["step"] == 7 and torch.load(state, weights_only=True)["step"] == 7
    assert not torch.equal(first.blocks[0][0][0], straight.blocks[0][0][0])
    resumed, hist = fit_heads(hidden, targets, lm, None, opts, state_path=state, resume=True)
    assert hist[-1]["step"] == 12
    for a, b in zip(resumed.blocks, straight.blocks, strict=True):
        for (wa, ba), (wb, bb) in zip(a, b, strict=True):
            assert torch.equal(wa, wb) and torch.equal(ba, bb)
    if not share:
        assert all(torch.equal(a, b) for a, b in zip(resumed.lm_heads, straight.lm_heads, strict=True))
    # other settings: refused, with the setting named
    with pytest.raises(Exception, match="other settings \\(lr\\)"):
        fit_heads(hidden, targets, lm, None, FitOptions(**{**opts.__dict__, "lr": 1e-3}), state_path=state,
                  resume=True)


def test_row_adam_over_every_row_is_torchs_adamw_and_leaves_untouched_rows_as_they_were():
    from trtllm_medusa_ports.heads.rowadam import RowAdam

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(12, 5, generator=g), torch.randn(12, 5, generator=g)
    ref = [a.clone().requires_grad_(True), b.clone().requires_grad_(True)]
    adamw = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    mine = [a.clone(), b.clone()]
    rows = RowAdam(mine, 1e-2, weight_decay=0.1)
    every = torch.arange(12)
    for _ in range(4):
        grads = [torch.randn(12, 5, generator=g) for _ in ref]
        for t, gr in zip(ref, grads, strict=True):
            t.grad = gr.clone()
        adamw.step()
        rows.step(every, grads)
    assert all(torch.allclose(x, y.detach(), rtol=1e-6, atol=1e-7) for x, y in zip(mine, ref, strict=True))
    some = torch.tensor([1, 7])
    before = [t.clone() for t in mine]
    rows.step(some, [torch.ones(2, 5), torch.ones(2, 5)])
    for t, old in zip(mine, before, strict=True):
        moved = (t != old).any(1)
        assert moved[some].all() and int(moved.sum()) == 2  # the step's rows alone


def test_row_updates_train_own_lm_heads_and_resume_to_the_uninterrupted_weights(tmp_path):
    """Own lm_heads' row-wise updates (the default; FitOptions.dense_updates off): they learn (the loss falls), rows outside every step's columns are the
    base's, and a resumed run ends with the weights of an uninterrupted one (the row moments are saved)."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(400, 16, generator=g)
    lm = torch.randn(60, 16, generator=g)
    targets = torch.stack([(hidden[:, 0] > 0).long() * 3, (hidden[:, 1] > 0).long() + 7], 1)
    opts = FitOptions(num_heads=2, steps=40, lr=3e-2, batch_size=64, negatives=4, save_every=10)
    straight, hist = fit_heads(hidden, targets, lm, None, opts)
    assert hist[-1]["loss"] < hist[0]["loss"] / 2
    moved = (straight.lm_heads[0] != lm).any(1)
    assert moved[[0, 3, 7, 8]].all() and not moved.all()  # the targets' rows moved; not every row was drawn
    state = tmp_path / "state.pt"
    fit_heads(hidden, targets, lm, None, opts, state_path=state, stop_after=17)
    resumed, _ = fit_heads(hidden, targets, lm, None, opts, state_path=state, resume=True)
    assert all(torch.equal(x, y) for x, y in zip(resumed.lm_heads, straight.lm_heads, strict=True))
    assert torch.equal(resumed.blocks[1][0][0], straight.blocks[1][0][0])
    with pytest.raises(Exception, match="other settings \\(dense_updates\\)"):
        fit_heads(hidden, targets, lm, None, FitOptions(**{**opts.__dict__, "dense_updates": True}), state_path=state,
                  resume=True)
    dense, _ = fit_heads(hidden, targets, lm, None, FitOptions(**{**opts.__dict__, "dense_updates": True}))
    # torch's AdamW moves the rows once drawn on every later step too (momentum): the same rows, other values
    assert torch.equal((dense.lm_heads[0] != lm).any(1), moved)
    assert not torch.allclose(dense.lm_heads[0][moved], straight.lm_heads[0][moved])


@pytest.mark.parametrize("dense", [False, True])
def test_anchor_holds_own_lm_heads_near_the_base_lm_head(dense):
    """FitOptions.anchor pulls own lm_heads toward the base's lm_head (their start) as decoupled weight decay pulls
    toward 0: the further the stronger, rows no step drew untouched, and 0 is the run without it, bit for bit."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(400, 16, generator=g)
    lm = torch.randn(60, 16, generator=g)
    targets = torch.stack([(hidden[:, 0] > 0).long() * 3, (hidden[:, 1] > 0).long() + 7], 1)
    opts = FitOptions(num_heads=2, steps=40, lr=3e-2, batch_size=64, negatives=4, dense_updates=dense)
    free, _ = fit_heads(hidden, targets, lm, None, opts)
    zero, _ = fit_heads(hidden, targets, lm, None, FitOptions(**{**opts.__dict__, "anchor": 0.0}))
    held, hist = fit_heads(hidden, targets, lm, None, FitOptions(**{**opts.__dict__, "anchor": 10.0}))
    assert all(torch.equal(a, b) for a, b in zip(free.lm_heads, zero.lm_heads, strict=True))
    for k in range(2):
        drift_free, drift_held = (free.lm_heads[k] - lm).norm(), (held.lm_heads[k] - lm).norm()
        assert 0 < drift_held < 0.8 * drift_free, (k, float(drift_held), float(drift_free))
    assert torch.equal((held.lm_heads[0] != lm).any(1), (free.lm_heads[0] != lm).any(1))  # the same rows moved
    assert hist[-1]["loss"] < hist[0]["loss"]  # it still learns


@pytest.mark.parametrize("matmul_dtype", ["float32", "bfloat16"])
def test_training_lowers_the_loss_on_learnable_targets(matmul_dtype):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(400, 16, generator=g)
    lm = torch.randn(30, 16, generator=g)
    targets = torch.stack([(hidden[:, 0] > 0).long() * 3, (hidden[:, 1] > 0).long() + 7], 1)  # learnable
    heads, hist = fit_heads(hidden, targets, lm, None, FitOptions(num_heads=2, steps=150, lr=3e-2, batch_size=128,
                                                                  share_lm_head=True, matmul_dtype=matmul_dtype))
    assert hist[-1]["loss"] < hist[0]["loss"] / 3
    logits = heads.apply(hidden, lm)
    assert float((logits[0].argmax(-1) == targets[:, 0]).float().mean()) > 0.9
    assert all(t.dtype == torch.float32 for row in heads.blocks for wb in row for t in wb)  # weights stay float32


def test_bfloat16_products_train_the_heads_float32_does():
    """The same run with the vocabulary products in bfloat16 ends with heads that rank like the float32 run's."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(600, 24, generator=g)
    lm = torch.randn(50, 24, generator=g)
    targets = torch.stack([(hidden[:, :3] @ torch.randn(3, 50, generator=g)).argmax(-1)] * 2, 1)
    got = {}
    for dt in ("float32", "bfloat16"):
        heads, _ = fit_heads(hidden, targets, lm, None, FitOptions(num_heads=2, steps=120, lr=2e-2, batch_size=128,
                                                                   share_lm_head=True, matmul_dtype=dt))
        got[dt] = heads.apply(hidden, lm)[0].argmax(-1)
    assert float((got["float32"] == got["bfloat16"]).float().mean()) > 0.9
    acc = {dt: float((a == targets[:, 0]).float().mean()) for dt, a in got.items()}
    assert acc["bfloat16"] > acc["float32"] - 0.03 and acc["float32"] > 0.3, acc  # as accurate, and learning
    with pytest.raises(Exception, match="--fit_dtype int8 is not one of"):
        fit_heads(hidden, targets, lm, None, FitOptions(num_heads=2, steps=1, matmul_dtype="int8"))


def test_distillation_matches_the_base_distribution_at_the_right_position():
    """distill=1: head k at row r learns the base's distribution at row r + k + 1 of the same sequence,
    whatever the hard targets say; distill=0 learns the hard targets (here noise)."""
    g = torch.Generator().manual_seed(3)
    H, V, seqs, length = 12, 20, 16, 30
    perm = torch.randperm(H, generator=g)  # h[t + 1] = h[t][perm]: the future is a function of the present
    rows, index = [], []
    for s in range(seqs):
        h = torch.randn(H, generator=g)
        for t in range(length):
            rows.append(h)
            index.append((s, t))
            h = h[perm]
    hidden, index = torch.stack(rows), torch.tensor(index)
    lm = torch.randn(V, H, generator=g) * 3
    teacher = (hidden @ lm.T).argmax(-1)
    noise = torch.randint(0, V, (hidden.shape[0], 2), generator=g)
    pos = index[:, 1]
    for k in range(2):
        noise[pos + k + 2 >= length, k] = -1
    agree = {}
    for w in (0.0, 1.0):
        opts = FitOptions(num_heads=2, steps=300, lr=3e-2, batch_size=None, share_lm_head=False, full_vocab=True,
                          schedule="constant", distill=w)
        heads, _ = fit_heads(hidden, noise, lm, None, opts, index=index)
        logits = heads.apply(hidden, lm)
        for k in range(2):
            ok = noise[:, k] >= 0
            r = torch.nonzero(ok).squeeze(1)
            got = logits[k][r].argmax(-1)
            agree[w, k] = (float((got == teacher[r + k + 1]).float().mean()), float((got == noise[r, k]).float().mean()))
    for k in range(2):
        assert agree[1.0, k][0] > 0.8 > agree[0.0, k][0], agree  # soft: the base at t + k + 1
        assert agree[0.0, k][1] > agree[1.0, k][1], agree  # hard: the given targets
    # rows that are not consecutive positions of their sequences cannot be distilled
    with pytest.raises(ValueError, match="not consecutive"):
        fit_heads(hidden, noise, lm, None, FitOptions(num_heads=2, steps=1, distill=0.5), index=index.flip(0))


def _data(tmp_path, vocab, n=12, length=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    path = tmp_path / "data.jsonl"
    rows = [{"prompt_ids": torch.randint(1, vocab, (length,), generator=g).tolist()} for _ in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize("arch,share", [("GemmaForCausalLM", True), ("PhiForCausalLM", False),
                                        ("Qwen2ForCausalLM", True)])
def test_train_heads_cli_writes_heads_that_load_convert_and_verify(tmp_path, store, arch, share, capsys):
    base = tiny_base(store, arch)
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    out = tmp_path / "heads"
    args = ["train-heads", "--model_dir", str(base), "--output_dir", str(out), "--num_heads", "2", "--num_layers",
            "1", "--data", str(_data(tmp_path, vocab)), "--new_tokens", "10", "--steps", "6", "--batch_size", "32",
            "--quiet"] + (["--share_lm_head"] if share else [])
    assert main(args) == 0
    assert "6 steps" in capsys.readouterr().out
    heads = load_heads(out)
    layout = "fasterdecoding-v2" if share else "fasterdecoding"
    assert (heads.layout, heads.num_heads, heads.num_layers, heads.shares_base_lm_head) == (layout, 2, 1, share)
    assert not heads.warnings
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 2 and cfg.get("version") == ("2" if share else None)
    assert cfg["medusa_ports_training"]["steps"] == 6
    assert (tmp_path / "heads.train" / "corpus.pt").is_file()
    # a second run reuses the cached corpus and refuses a non-empty output without --overwrite
    assert main(args) == 1
    assert "not empty" in capsys.readouterr().err
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(out), "--output_dir", str(ckpt),
                 "--dtype", "float16", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--prompt_ids", "1,2,3",
                 "--max_new_tokens", "6", "--quiet", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["heads_parity"] is True


def test_train_heads_refuses_bad_input(tmp_path, store, capsys):
    base = tiny_base(store, "Qwen2ForCausalLM")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1, 2]}\n{"nothing": 1}\n')
    assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(bad),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "line 2 has none of prompt, text, prompt_ids, input_ids" in err and str(bad) in err
    assert not (tmp_path / "h").exists()
    big = tmp_path / "big.jsonl"
    big.write_text('{"prompt_ids": [1, 99999]}\n')
    assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(big),
                 "--quiet"]) == 1
    assert f"error: {big}: --data item 0: token ids [99999] are outside the vocabulary" in capsys.readouterr().err
    # issue 76 (th_json_bad_data): a key that is there with a value of the wrong kind is named so, not as missing,
    # also under --json (one object on stdout, exit 1, nothing written)
    for value, shown in (('"abc"', '"abc"'), ("[1.5, 2]", "[1.5, 2]"), ("[true, 2]", "[true, 2]"), ("[]", "[]")):
        bad.write_text('{"prompt_ids": [1, 2]}\n{"prompt_ids": ' + value + '}\n')
        assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(bad),
                     "--quiet", "--json"]) == 1
        got = json.loads(capsys.readouterr().out)
        assert got["error"] == f"line 2: prompt_ids is {shown}, not a non-empty list of integer token ids", got
        assert got["where"] == str(bad) and got["exit_code"] == 1
    bad.write_text('{"text": 5}\n')
    assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(bad),
                 "--quiet"]) == 1
    assert "line 1: text is 5, not a string" in capsys.readouterr().err
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.train").exists()
    # issue 78: a failed run leaves no <output_dir>.train of its own making behind, and says what a kept one holds
    assert not (tmp_path / "h.train").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "corpus.pt").write_bytes(b"")
    assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(big),
                 "--work_dir", str(kept)]) == 1
    err = capsys.readouterr().err
    assert err.index("error: ") < err.index(f"note: {kept} keeps corpus.pt: a rerun with the same inputs reuses")
    assert main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--distill", "1.5",
                 "--quiet"]) == 2
    assert "--distill 1.5 must be between 0 and 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one of its choices
        main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


def test_corpus_in_bfloat16_is_cached_apart_from_float32(tmp_path, store):
    """--dtype bfloat16 writes its own corpus (another cache key); the heads fit in float32 either way."""
    from trtllm_medusa_ports.fixtures.synthetic import tiny_config
    from trtllm_medusa_ports.heads.train import FitOptions, TrainOptions, train

    base = tiny_base(store, "LlamaForCausalLM")
    data = _data(tmp_path, tiny_config("LlamaForCausalLM").vocab_size)
    runs, keys, hidden = {}, {}, {}
    for dtype in ("float32", "bfloat16"):
        runs[dtype] = train(TrainOptions(model_dir=base, output_dir=tmp_path / "h", work_dir=tmp_path / "w",
                                         prompts=PromptInputs(data=data),
                                         new_tokens=8, dtype=dtype, overwrite=True,
                                         fit=FitOptions(num_heads=2, steps=3, batch_size=16)))
        saved = torch.load(tmp_path / "w" / "corpus.pt", weights_only=True)
        first = torch.ones(saved["index"].shape[0], dtype=torch.bool)  # each sequence's first row: the
        first[1:] = saved["index"][1:, 0] != saved["index"][:-1, 0]  # prompt's last position, same input
        keys[dtype], hidden[dtype] = saved["key"], saved["hidden"][first]
        assert runs[dtype].heads.blocks[0][0][0].dtype == torch.float32
    assert keys["float32"] != keys["bfloat16"]  # built again, not read from the other dtype's cache
    assert hidden["bfloat16"].dtype == torch.float32 and hidden["bfloat16"].shape == hidden["float32"].shape
    assert not torch.equal(hidden["bfloat16"], hidden["float32"])  # computed in bfloat16
    assert torch.allclose(hidden["bfloat16"], hidden["float32"], atol=0.05, rtol=0.05)


# -- tree construction --------------------------------------------------------------------------
def _brute_force_best(acc, size, depth, top_k):
    universe = [p for d in range(1, depth + 1) for p in itertools.product(range(top_k), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(universe, size):
        s = set(subset)
        if all(p[:-1] in s or len(p) == 1 for p in s):
            best = max(best, expected_tokens_per_step(subset, acc))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_tree_is_the_best_tree_of_its_size(seed):
    g = torch.Generator().manual_seed(seed)
    acc = []
    for _ in range(2):  # two heads, top-3, accuracies falling with the rank
        row = torch.rand(3, generator=g).sort(descending=True).values
        acc.append((row / row.sum() * 0.8).tolist())
    for size in (1, 3, 5, 6):
        tree = build_tree(acc, size, top_k=3)
        assert len(tree) == size and not validate_choices(tree, top_k=3, num_heads=2)
        assert expected_tokens_per_step(tree, acc) == pytest.approx(_brute_force_best(acc, size, 2, 3))


def test_expected_tokens_is_one_plus_the_sum_of_path_products():
    acc = [[0.5, 0.2, 0.1], [0.4, 0.1, 0.0]]
    paths = [[0], [1], [0, 0], [0, 1], [1, 0]]
    want = 1 + 0.5 + 0.2 + 0.5 * 0.4 + 0.5 * 0.1 + 0.2 * 0.4
    assert expected_tokens_per_step(paths, acc) == pytest.approx(want)
    # the greedy order on this table: [0] .5, [1] .2, [0,0] .2 (shorter first on ties), [2] .1, [1,0] .08 ...
    assert build_tree(acc, 4, top_k=3) == [[0], [1], [2], [0, 0]]
    # zero-valued nodes are never added: the tree stops short of the budget
    assert len(build_tree([[1.0, 0.0], [0.0, 0.0]], 10, top_k=2)) == 1


def test_joint_counts_and_measured_acceptance():
    ranks = torch.tensor([[0, 0], [0, 1], [1, 0], [5, 0], [0, -1]])
    joint = joint_values(ranks, top_k=3)
    assert joint[(0,)] == pytest.approx(3 / 5) and joint[(0, 0)] == pytest.approx(1 / 5)
    assert (5,) not in joint and (0, 1) in joint
    acc = accuracy_table(ranks, 3)
    assert acc[0] == pytest.approx([3 / 5, 1 / 5, 0.0]) and acc[1] == pytest.approx([3 / 4, 1 / 4, 0.0])
    paths = [[0], [1], [0, 0]]
    # per position: 3, 2, 2, 1, 2 tokens
    assert measured_acceptance(paths, ranks) == pytest.approx(10 / 5)
    assert expected_tokens_per_step(paths, joint=joint) == pytest.approx(measured_acceptance(paths, ranks))
    tree = build_tree(None, 2, top_k=3, joint=joint, max_depth=2)
    assert tree == [[0], [1]]
    # each position's longest acceptable path stops at the first miss (rank >= top_k) or missing target (-1)
    assert [rank_path(r, 3) for r in ranks.tolist()] == [(0, 0), (0, 1), (1, 0), (), (0,)]
    assert rank_path([2, 3, 0], 3) == (2,) and rank_path([2, 3, 0], 4) == (2, 3, 0)
    assert [accepted_length(p, {(0,), (1,), (0, 0)}) for p in [(0, 0, 1), (0, 1), (1, 0), (2,), ()]] == [2, 1, 1, 0, 0]


def test_rank_of_targets():
    logits = torch.tensor([[0.1, 0.9, 0.5, 0.0], [1.0, 0.0, 0.0, 0.5]])
    assert rank_of_targets(logits, torch.tensor([2, 1]), 2).tolist() == [1, 2]


# -- the CLI: tune-tree, @FILE everywhere, tree --draw, verify's prediction -----------------------
def test_tune_tree_file_works_in_check_convert_verify_and_tree(tmp_path, llama_trained, capsys):
    base, heads = llama_trained
    out = tmp_path / "tree.json"
    assert main(["tune-tree", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--prompt_ids",
                 "5,6,7;9,3;11,2,8;4", "--new_tokens", "24", "--max_nodes", "12", "--output", str(out),
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "predicted tokens per step" in text and "mc_sim_7b_63" in text
    paths = json.loads(out.read_text())
    assert 1 <= len(paths) <= 12 and not validate_choices(paths, num_heads=3)
    import ast

    assert ast.literal_eval(out.read_text()) == paths  # what TensorRT-LLM's run.py does with the text
    spec = f"@{out}"
    assert main(["tree", "--choices", spec, "--draw"]) == 0
    drawn = capsys.readouterr().out
    assert drawn.startswith(f"root (the base's token; {len(paths)} nodes") and drawn.count("(head 0, top-") == sum(
        1 for p in paths if len(p) == 1)
    assert main(["check", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--medusa_choices", spec]) == 0
    capsys.readouterr()
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir", str(ckpt),
                 "--dtype", "float16", "--medusa_choices", spec, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--medusa_choices", spec,
                 "--prompt_ids", "5,6,7;9,3", "--max_new_tokens", "16", "--quiet"]) == 0
    rendered = capsys.readouterr().out
    assert f"for this {len(paths)}-node tree" in rendered
    # an existing output is not replaced without --overwrite
    assert main(["tune-tree", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--prompt_ids", "5,6,7",
                 "--output", str(out), "--quiet"]) == 1
    assert "the output file exists" in capsys.readouterr().err


def test_verify_reports_predicted_against_measured(tmp_path, llama_trained, capsys):
    from conftest import convert_to

    from trtllm_medusa_ports.verify import verify

    base, heads = llama_trained
    ckpt = convert_to(tmp_path / "ckpt", base, heads, dtype="float32")
    rep = verify(base, ckpt, medusa_choices="[[0], [1], [0, 0], [0, 0, 0]]", prompts=[[5, 6, 7], [9, 3], [4, 4]],
                 max_new_tokens=24, quiet=True)
    assert rep.proof_ok and rep.tree_nodes == 4  # float32: exact (and not servable: rule dtype-float32)
    assert 1.0 <= rep.predicted_mean_accepted_tokens_per_step <= 5.0 and 1.0 <= rep.predicted_mean_accepted_tokens_per_step_joint <= 5.0
    assert rep.mean_accepted_tokens_per_step > 1.2  # trained heads: multi-token acceptance
    # the joint estimate counts the same events the run accepts: it lands close to the measurement
    assert abs(rep.predicted_mean_accepted_tokens_per_step_joint - rep.mean_accepted_tokens_per_step) < 0.5
    d = rep.to_dict()
    assert d["predicted_mean_accepted_tokens_per_step"] == rep.predicted_mean_accepted_tokens_per_step


def test_draw_marks_every_node():
    tree = MedusaTree.from_spec([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    text = draw(tree)
    assert text.splitlines()[1:] == [
        "├── 0  (head 0, top-1)",
        "│   ├── 0  (head 1, top-1)",
        "│   │   └── 0  (head 2, top-1)",
        "│   └── 1  (head 1, top-2)",
        "└── 1  (head 0, top-2)",
    ]


def test_verify_reports_tokens_per_step_until_the_end_token(tmp_path, llama_trained):
    """With an end token the base emits mid-run, verify also reports the runs cut there (as a runtime
    stopping at end_id would), and still compares every token for greedy equivalence."""
    import shutil

    from conftest import convert_to

    from trtllm_medusa_ports.reference import ReferenceModel, medusa_generate
    from trtllm_medusa_ports.verify import verify

    base, heads = llama_trained
    ckpt = convert_to(tmp_path / "ckpt", base, heads, dtype="float32")
    choices, prompt = "[[0], [1], [0, 0], [0, 0, 0]]", [5, 6, 7]
    tree = MedusaTree.from_spec(json.loads(choices))
    run = medusa_generate(ReferenceModel(ckpt), prompt, tree, 24)
    end = next(t for i, t in enumerate(run.tokens) if i >= 6 and t not in run.tokens[:i])  # first seen mid-run

    def base_ending_with(eos: int | None) -> Path:  # the base's own files name its end token
        copy = tmp_path / f"base-{eos}"
        shutil.copytree(base, copy)
        for name in ("config.json", "generation_config.json"):
            cfg = json.loads((copy / name).read_text())
            (copy / name).write_text(json.dumps({**cfg, "eos_token_id": eos}))
        return copy

    rep = verify(base_ending_with(end), ckpt, medusa_choices=choices, prompts=[prompt], max_new_tokens=24, quiet=True)
    tokens, steps = run.until_end({end})
    assert 0 < steps < run.steps and rep.prompts_ending_early == 1
    assert rep.tokens_per_step_until_end == tokens / steps
    assert rep.greedy_equal and rep.tokens_generated == 24  # the run itself went on past the end token
    assert f"speculation       : {tokens / steps:.2f} tokens per step until the end token (what a server sees; 1 of 1 prompt(s)" in rep.render()
    rep = verify(base_ending_with(None), ckpt, medusa_choices=choices, prompts=[prompt], max_new_tokens=24, quiet=True)
    # no end token: the 23 tokens after the context step's, over every step (the last step's drafts past the limit
    # are not returned by a runtime either), where the mean accepted counts them
    assert rep.prompts_ending_early == 0 and rep.tokens_per_step_until_end == 23 / rep.steps
    assert rep.tokens_per_step_until_end <= rep.mean_accepted_tokens_per_step
    assert "no prompt emits the end token" in rep.render()


def test_tune_trees_serving_figure_is_the_loop_verify_runs(tmp_path, llama_trained):
    """One measure, one name (issue 77, 3): tune-tree's predicted tokens per step until the end token replays the
    Medusa loop on the answers it measured (joint along the tree, cut after the end token), so on the same prompts it
    is what verify's reference loop measures until the end token, step for step."""
    import shutil

    from conftest import convert_to

    from trtllm_medusa_ports.trees.tune import tune
    from trtllm_medusa_ports.verify import verify

    base, heads = llama_trained
    ckpt = convert_to(tmp_path / "ckpt", base, heads, dtype="float32")
    ended = tmp_path / "base-ended"
    shutil.copytree(base, ended)
    for name in ("config.json", "generation_config.json"):  # an end token the base emits in some answers
        cfg = json.loads((ended / name).read_text())
        (ended / name).write_text(json.dumps({**cfg, "eos_token_id": 9}))
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 3], [20, 21, 22]]
    res = tune(ended, heads, prompt_ids=prompts, new_tokens=24, max_nodes=8, baseline=None)
    rep = verify(ended, ckpt, medusa_choices=json.dumps(res.paths), prompts=prompts, max_new_tokens=24, quiet=True)
    assert rep.tokens_per_step_until_end is not None and rep.tokens_per_step_until_end > 1.0
    assert res.predicted_tokens_per_step_until_end == pytest.approx(rep.tokens_per_step_until_end, abs=1e-9)
    assert res.to_dict()["predicted_tokens_per_step_until_end"] == round(res.predicted_tokens_per_step_until_end, 4)


def test_the_loop_replay_counts_generation_steps_until_the_end():
    from trtllm_medusa_ports.trees.acceptance import loop_until_end

    tree = [[0], [0, 0]]
    answers = [torch.tensor([[0, 0], [5, 0], [0, 5], [-1, -1]]),  # one step accepts both drafts: 3 tokens, 1 step
               torch.tensor([[1, 0], [0, -1], [-1, -1]]),  # rank 1 is in no path, then one draft: 2 tokens, 2 steps
               torch.tensor([[0, 0]])]  # the end token came first: the context step alone, no generation step
    assert loop_until_end(tree, answers) == (5, 3)


@pytest.mark.parametrize("signame, when", [("SIGINT", "step"), ("SIGTERM", "step"), ("SIGINT", "save"),
                                           ("SIGTERM", "save")])
def test_a_signal_at_any_point_of_the_fit_resumes_bit_for_bit(tmp_path, monkeypatch, signame, when):
    """SIGINT / SIGTERM take effect at the next step boundary: the saved state holds exactly its steps (a save
    in progress finishes first), and --resume ends with the uninterrupted run's weights."""
    import os
    import signal

    import trtllm_medusa_ports.heads.fit as train_mod  # the fit's own module: fit_heads calls these
    from trtllm_medusa_ports.heads.fit import TrainingInterrupted

    hidden, targets, lm = _toy()
    opts = FitOptions(num_heads=2, steps=12, lr=1e-2, batch_size=32, share_lm_head=False, save_every=5)
    straight, _ = fit_heads(hidden, targets, lm, None, opts)
    sig = getattr(signal, signame)
    real_lr, real_save = train_mod.lr_at, train_mod.save_state
    if when == "step":  # in the middle of step 8 (before its update)
        monkeypatch.setattr(train_mod, "lr_at", lambda s, o: (os.kill(os.getpid(), sig) if s == 8 else None,
                                                             real_lr(s, o))[1])
    else:  # during the periodic save after step 5
        def save_state(path, o, state):
            os.kill(os.getpid(), sig)
            real_save(path, o, state)
        monkeypatch.setattr(train_mod, "save_state", save_state)
    state = tmp_path / "state.pt"
    with pytest.raises(TrainingInterrupted) as exc:
        fit_heads(hidden, targets, lm, None, opts, state_path=state)
    want = 9 if when == "step" else 5
    assert exc.value.step == want and exc.value.signum == sig
    assert torch.load(state, weights_only=True)["step"] == want
    monkeypatch.setattr(train_mod, "lr_at", real_lr)
    monkeypatch.setattr(train_mod, "save_state", real_save)
    resumed, hist = fit_heads(hidden, targets, lm, None, opts, state_path=state, resume=True)
    assert hist[-1]["step"] == 12
    for a, b in zip(resumed.blocks, straight.blocks, strict=True):
        for (wa, ba), (wb, bb) in zip(a, b, strict=True):
            assert torch.equal(wa, wb) and torch.equal(ba, bb)
    assert all(torch.equal(a, b) for a, b in zip(resumed.lm_heads, straight.lm_heads, strict=True))
    assert signal.getsignal(signal.SIGINT) is not None  # handlers restored after the fit


def test_a_damaged_training_state_is_refused_by_name(tmp_path):
    from trtllm_medusa_ports.errors import HeadsError
    from trtllm_medusa_ports.heads.fit import load_state

    hidden, targets, lm = _toy()
    opts = FitOptions(num_heads=2, steps=4, lr=1e-2, batch_size=32, share_lm_head=True)
    state = tmp_path / "state.pt"
    fit_heads(hidden, targets, lm, None, opts, state_path=state, stop_after=2)
    d = torch.load(state, weights_only=True)
    d.pop("optimizer")
    torch.save(d, state)
    with pytest.raises(HeadsError, match="incomplete or damaged") as exc:
        load_state(state, opts)
    assert exc.value.where == str(state) and "without --resume" in exc.value.fix


def test_tune_tree_says_when_the_tree_leaves_heads_unused(tmp_path, monkeypatch, capsys):
    import trtllm_medusa_ports.trees.tune as tune_mod
    from trtllm_medusa_ports.cli import main as cli_main

    shallow = tune_mod.TuneResult(paths=[[0], [1]], accuracy=[[0.5, 0.2], [0.1, 0.1], [0.05, 0.05]],
                                  predicted_mean_accepted_tokens_per_step=1.7, measured_on_text=1.6, positions=10, estimate="product")
    monkeypatch.setattr(tune_mod, "tune", lambda *a, **k: shallow)
    out = tmp_path / "t.json"
    assert cli_main(["tune-tree", "--model_dir", str(tmp_path / "m"), "--medusa_model_dir", str(tmp_path / "h"),
                     "--output", str(out), "--prompt_ids", "1,2"]) == 0
    assert "the tree uses 1 of the 3 heads: heads 1..2" in capsys.readouterr().err
    assert json.loads(out.read_text()) == [[0], [1]]


def test_one_vocabulary_check_names_the_item_its_ids_and_the_file():
    from trtllm_medusa_ports.errors import ModelError, PortError
    from trtllm_medusa_ports.files.prompts import check_ids

    check_ids([[0, 49], [7]], 50)  # inside: nothing raised
    with pytest.raises(PortError) as e:
        check_ids([[1, 2], [3, 99, -1, 50, 51]], 50, "calibration sample", where="c.jsonl", fix="retokenize")
    assert e.value.what == "calibration sample 1: token ids [99, -1, 50] are outside the vocabulary 0..49"
    assert (e.value.where, e.value.fix) == ("c.jsonl", "retokenize")
    with pytest.raises(ModelError, match=r"prompt 0 is empty: no token ids"):
        check_ids([[]], 50, error=ModelError)
