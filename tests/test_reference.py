"""The reference executor and `verify`: parity, greedy equivalence, and failures that must be caught."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_tree_step_matches_sequential,
    built_once,
    convert_to,
    run_store,
    tiny_base,
)
from safetensors.torch import load_file, save_file

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import EXIT_FOUND
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config
from trtllm_medusa_ports.reference import (
    ReferenceModel,
    greedy_accept,
    medusa_generate,
    plain_generate,
)
from trtllm_medusa_ports.trees.tree import MedusaTree
from trtllm_medusa_ports.verify import verify

#: floating-point results: CI runs these on every ATen CPU path (.ci/run)
pytestmark = pytest.mark.numerics

TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1],[0,1,0]]"


@pytest.mark.parametrize(
    "arch, tp, pp, dtype",
    [
        ("LlamaForCausalLM", 1, 1, "float32"),
        ("LlamaForCausalLM", 2, 1, "float16"),
        ("Qwen2ForCausalLM", 1, 1, "float32"),
        ("Qwen2ForCausalLM", 2, 1, "bfloat16"),
        ("MistralForCausalLM", 2, 2, "float32"),
    ],
)
def test_parity_and_greedy_equivalence(tmp_path, store, arch, tp, pp, dtype):
    base = tiny_base(store, arch)
    c = tiny_config(arch)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=3, seed=7), tmp_path / "h")
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=tp, pp_size=pp, dtype=dtype)
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=20)
    assert rep.parity, rep.render()
    assert rep.logits_max_abs_diff <= rep.tolerance <= 1e-4 * 50
    assert rep.greedy_equal, rep.render()
    assert rep.tokens_generated == 40 and rep.steps >= 1
    assert len(rep.head_top1) == 3 and all(0.0 <= x <= 1.0 for x in rep.head_top1)


def test_trained_heads_accept_several_tokens_per_step(tmp_path, llama_trained):
    base, heads = llama_trained
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=2)
    rep = verify(base, ckpt, medusa_choices="mc_sim_7b_63", max_new_tokens=40)
    assert rep.proof_ok, rep.render()
    # multi-token acceptance happened, so accepted KV entries were moved behind the root
    assert rep.mean_accepted_tokens_per_step > 2.0, rep.render()
    assert max(rep.head_top1) > 0.3
    assert rep.steps < rep.tokens_generated - len(rep.prompts)


def test_head_hit_rates_count_every_position_with_a_target(tmp_path, llama_trained):
    """Head k at position t (from the prompt's last token on) is scored against the token at t + k + 2: counted
    here position by position, against verify's measure (one causal pass per sequence, shared with the tree's
    predicted tokens per step: final_hidden_states)."""
    from trtllm_medusa_ports.verify.limits import HIT_TOP_K
    from trtllm_medusa_ports.verify.measures import final_hidden_states, head_hit_rates

    base, heads = llama_trained
    ref = ReferenceModel(convert_to(tmp_path / "c", base, heads))
    prompts = [[5, 9, 200, 31], [7, 7, 3]]
    seqs = [p + plain_generate(ref, p, n) for p, n in zip(prompts, (12, 3), strict=True)]
    seqs.append([11, 12])  # a prompt with nothing after it: no position counts
    plens = [4, 3, 2]
    hits1, hitsk, counts = [0] * 3, [0] * 3, [0] * 3
    for seq, plen in zip(seqs, plens, strict=True):
        _, hidden = ref.forward(seq, ref.new_cache(), compute_logits=False)
        logits = ref.medusa_logits(hidden)
        for k in range(3):
            for t in range(plen - 1, len(seq) - k - 2):
                ranked = logits[k, t].topk(HIT_TOP_K).indices.tolist()
                counts[k] += 1
                hits1[k] += ranked[0] == seq[t + k + 2]
                hitsk[k] += seq[t + k + 2] in ranked
    assert counts == [11 + 2, 10 + 1, 9 + 0]  # n new tokens: n - k - 1 positions for head k
    want = ([h / c for h, c in zip(hits1, counts, strict=True)], [h / c for h, c in zip(hitsk, counts, strict=True)])
    assert head_hit_rates(ref, seqs, plens) == want
    assert head_hit_rates(ref, seqs, plens, final_hidden_states(ref, seqs)) == want
    assert max(want[0]) > 0.3 and all(a <= b for a, b in zip(*want, strict=True))  # trained: the counts mean something


def test_tree_step_equals_sequential_decoding(tmp_path, qwen2_base, qwen2_heads):
    """Each tree node's logits equal plain decoding of its path (what makes Medusa exact)."""
    ckpt = convert_to(tmp_path / "c", qwen2_base, qwen2_heads, tp_size=2)
    tree = MedusaTree.from_spec(TREE)
    tokens = torch.tensor([17, 3, 4, 250, 8, 9, 10, 11, 12, 13])
    assert_tree_step_matches_sequential(ReferenceModel(ckpt), [5, 9, 200, 31], tokens, tree)


def test_pads_never_match():
    # tree [[0], [1], [1, 0]]: rows (leaves in order) [0, 1, -1] and [0, 2, 3]
    tree = MedusaTree.from_spec([[0], [1], [1, 0]])
    paths = tree.retrieve_paths()
    assert paths == [[0, 1, -1], [0, 2, 3]]
    tokens = torch.tensor([42, 7, 8, 9])
    predicted = torch.tensor([7, 0, 1, 1])  # draft [0] matches; the base's next token is id 0
    assert greedy_accept(tokens, predicted, paths) == (0, 1)
    # The FasterDecoding / TensorRT-LLM comparison reads a pad as token 0 and accepts it:
    padded_tokens = torch.cat([tokens, torch.tensor([0])])
    row = [i if i >= 0 else len(tokens) for i in paths[0]]
    upstream_len = 0
    for d in range(1, len(row)):
        if padded_tokens[row[d]] != torch.cat([predicted, torch.tensor([0])])[row[d - 1]]:
            break
        upstream_len += 1
    assert upstream_len == 2  # the bug this toolkit avoids


def test_greedy_accept_longest_and_first_on_ties():
    tree = MedusaTree.from_spec([[0], [1], [0, 0], [1, 0]])
    paths = tree.retrieve_paths()  # [[0,1,3],[0,2,4]]
    tokens = torch.tensor([1, 5, 6, 7, 8])
    assert greedy_accept(tokens, torch.tensor([6, 0, 8, 0, 0]), paths) == (1, 2)
    assert greedy_accept(tokens, torch.tensor([9, 9, 9, 9, 9]), paths) == (0, 0)


def _rewrite(ckpt, rank, fn):
    f = ckpt / f"rank{rank}.safetensors"
    sd = load_file(str(f))
    fn(sd)
    save_file(sd, str(f))


@pytest.fixture(scope="module")
def good_ckpt(qwen2_base, qwen2_heads):
    """Converted once per run, read-only (the tests that break it break a copy: _broken)."""
    return built_once(run_store() / "reference-qwen2-tp2", lambda d: convert_to(d, qwen2_base, qwen2_heads, tp_size=2))


@pytest.fixture
def served_ckpt(qwen2_base, qwen2_heads):
    """good_ckpt in float16, the dtype an engine is built from (float32 is refused: rule dtype-float32)."""
    return built_once(run_store() / "reference-qwen2-tp2-fp16",
                      lambda d: convert_to(d, qwen2_base, qwen2_heads, tp_size=2, dtype="float16"))


def _broken(good, tmp_path, name):
    d = tmp_path / name
    shutil.copytree(good, d)
    return d


def test_swapped_fc_gate_fails_parity(tmp_path, qwen2_base, good_ckpt):
    d = _broken(good_ckpt, tmp_path, "swapped")
    for r in range(2):
        def swap(sd):
            p = "transformer.layers.0."
            sd[p + "mlp.fc.weight"], sd[p + "mlp.gate.weight"] = sd[p + "mlp.gate.weight"], sd[p + "mlp.fc.weight"]
        _rewrite(d, r, swap)
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=8)
    assert not rep.parity and rep.logits_max_abs_diff > 1e-3
    assert rep.parity_divergence["where"] == "layer 0 output"
    first = rep.parity_divergence["first_differing_tensor"]
    assert first["tensor"] == "transformer.layers.0.mlp.fc.weight" and first["rank"] == 0
    assert "first tensor that differs from the converted HF weights: transformer.layers.0.mlp.fc.weight" \
        in rep.render()


def test_wrong_rope_base_fails_parity(tmp_path, qwen2_base, good_ckpt):
    d = _broken(good_ckpt, tmp_path, "rope")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rotary_base"] = 10000.0  # Qwen2 uses rope_theta 1e6: a classic port bug
    (d / "config.json").write_text(json.dumps(cfg))
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=8)
    assert not rep.parity
    assert rep.parity_divergence["where"] == "layer 0 output"
    assert rep.parity_divergence["first_differing_tensor"] is None  # every tensor right: a config field
    assert "every base tensor equals the converted HF weights" in rep.render()


def test_dropped_qkv_bias_fails_parity(tmp_path, qwen2_base, good_ckpt):
    d = _broken(good_ckpt, tmp_path, "nobias")
    for r in range(2):
        _rewrite(d, r, lambda sd: [sd.pop(f"transformer.layers.{i}.attention.qkv.bias") for i in range(2)])
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=8)
    assert not rep.parity and rep.parity_divergence["where"] == "layer 0 output"
    first = rep.parity_divergence["first_differing_tensor"]
    assert first == {"tensor": "transformer.layers.0.attention.qkv.bias", "rank": 0,
                     "why": "missing from the checkpoint"}


def test_wrong_tp_split_fails_parity(tmp_path, qwen2_base, good_ckpt):
    """Splitting the row-parallel dense on dim 0 instead of dim 1 (same shapes, wrong numbers)."""
    d = _broken(good_ckpt, tmp_path, "split")
    full = torch.cat([load_file(str(good_ckpt / f"rank{r}.safetensors"))["transformer.layers.0.attention.dense.weight"]
                      for r in range(2)], dim=1)
    for r in range(2):
        wrong = full.reshape(2, full.shape[0] // 2, full.shape[1])[r].reshape(full.shape[0], full.shape[1] // 2)

        def put(sd, wrong=wrong):
            sd["transformer.layers.0.attention.dense.weight"] = wrong.contiguous()
        _rewrite(d, r, put)
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=8)
    assert not rep.parity and rep.parity_divergence["where"] == "layer 0 output"
    first = rep.parity_divergence["first_differing_tensor"]
    assert first["tensor"] == "transformer.layers.0.attention.dense.weight" and "values differ" in first["why"]


def test_verify_cli_json_and_exit_codes(tmp_path, qwen2_base, good_ckpt, served_ckpt, capsys):
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(served_ckpt),
               "--medusa_choices", TREE, "--max_new_tokens", "10", "--prompt_ids", "1,2,3;40,50,60,70", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] and out["proof_ok"] and out["parity"] and out["greedy_equal"]
    assert out["build_refusals"] == []
    # float32 computes the base exactly, and TensorRT-LLM builds no spec-decoding engine from it: exit 1, saying so
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(good_ckpt),
               "--medusa_choices", TREE, "--max_new_tokens", "10", "--prompt_ids", "1,2,3;40,50,60,70", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == EXIT_FOUND and out["proof_ok"] and not out["ok"] and out["parity"] and out["greedy_equal"]
    assert out["build_refusals"] == ["[dtype-float32] TensorRT-LLM refuses float32 with speculative decoding (fix: "
                                     "convert with --dtype float16 or bfloat16)"]
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(good_ckpt),
               "--medusa_choices", TREE, "--max_new_tokens", "4"])
    text = capsys.readouterr().out
    assert rc == EXIT_FOUND and "engine build      : FAIL  [dtype-float32]" in text
    assert "RESULT: FAILED (the checkpoint computes the base model, but no engine is built from it" in text
    for key in ("logits_max_abs_diff", "tokens_generated", "steps", "mean_accepted_tokens_per_step", "head_top1"):
        assert key in out
    assert out["tokens_generated"] == 20 and out["prompts"] == [[1, 2, 3], [40, 50, 60, 70]]

    d = _broken(good_ckpt, tmp_path, "bad")
    _rewrite(d, 1, lambda sd: sd.__setitem__("transformer.layers.1.mlp.proj.weight",
                                             sd["transformer.layers.1.mlp.proj.weight"] * 3))
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(d),
               "--medusa_choices", TREE, "--max_new_tokens", "10", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == EXIT_FOUND and out["parity"] is False and out["ok"] is False
    assert out["parity_divergence"]["where"] == "layer 1 output or the final norm"
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert rc == 1 and f"{tmp_path / 'none'}: no such directory" in err, err  # issue 78: not "no config.json"
    (tmp_path / "empty").mkdir()
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(tmp_path / "empty")])
    assert rc == 1 and "no config.json: not a TensorRT-LLM checkpoint directory" in capsys.readouterr().err


def test_plain_and_medusa_decoding_agree_with_deep_tree(tmp_path, llama_trained):
    base, heads = llama_trained
    ref = ReferenceModel(convert_to(tmp_path / "c", base, heads, pp_size=2))
    tree = MedusaTree.from_spec([p for p in MedusaTree.from_spec("mc_sim_7b_63").paths if len(p) <= 3])
    for prompt in ([3, 4, 5], [100, 90, 80, 70, 60]):
        run = medusa_generate(ref, prompt, tree, 30)
        assert run.tokens == plain_generate(ref, prompt, 30)
        assert max(run.accepted_per_step) >= 3


def test_reached_argmax_equals_full_logits_where_acceptance_reads_it(tmp_path, llama_trained):
    """The Medusa loop projects only the rows acceptance reads; those rows give the full argmax."""
    from trtllm_medusa_ports.reference.decoding import _tree_children, draft_tokens, reached_argmax

    base, heads = llama_trained
    ref = ReferenceModel(convert_to(tmp_path / "c", base, heads, tp_size=2))
    tree = MedusaTree.from_spec([p for p in MedusaTree.from_spec("mc_sim_7b_63").paths if len(p) <= 3])
    paths = tree.retrieve_paths(ref.num_medusa_heads + 1)
    children = _tree_children(tree)
    partly = 0  # steps where acceptance reached some nodes beyond the root, not all of them
    for prompt in ([3, 4, 5], [100, 90, 80, 70, 60]):
        cache = ref.new_cache()
        _, hidden = ref.forward(prompt, cache, compute_logits=False)
        root = int(ref.logits(hidden[-1:]).argmax())
        head_logits = ref.medusa_logits(hidden[-1])
        for _ in range(6):
            tokens = draft_tokens(head_logits, root, tree)
            past = cache.length
            logits, hidden = ref.forward(tokens, cache, spec_decoding_position_offsets=tree.position_offsets,
                                         spec_decoding_packed_mask=tree.packed_mask)
            full = logits.argmax(-1)
            lazy = reached_argmax(ref, hidden, tokens, children)
            reached = lazy >= 0
            assert bool(reached[0]) and torch.equal(lazy[reached], full[reached])
            assert greedy_accept(tokens, lazy, paths) == greedy_accept(tokens, full, paths)
            # a node is projected exactly when acceptance can reach it: its parent was, and it matches
            for parent, kids in children.items():
                for c in kids:
                    assert bool(reached[c]) == (bool(reached[parent]) and int(tokens[c]) == int(full[parent]))
            partly += 1 < int(reached.sum()) < tokens.shape[0]
            best, n = greedy_accept(tokens, full, paths)
            nodes = paths[best][: n + 1]
            cache.keep(past, nodes)
            root, head_logits = int(full[nodes[-1]]), ref.medusa_logits(hidden[nodes[-1]])
    assert partly >= 3  # trained heads: the lazy projection was exercised beyond the root


def test_shared_lm_head_projects_all_heads_at_once(tmp_path, qwen2_base):
    """Heads sharing the base lm_head (FasterDecoding v2) are projected in one product: same logits."""
    c = tiny_config("Qwen2ForCausalLM")
    hd = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=3, seed=5, own_lm_head=False),
                    tmp_path / "h", "fasterdecoding-v2")
    ref = ReferenceModel(convert_to(tmp_path / "c", qwen2_base, hd, tp_size=2))
    assert ref.config.get("medusa_shared_lm_head")
    _, hidden = ref.forward([5, 6, 7], ref.new_cache(), compute_logits=False)
    got = ref.medusa_logits(hidden)
    assert got.shape == (3, 3, c.vocab_size)
    for h in range(3):
        x = hidden
        p = f"medusa_heads.{h}.medusa_layers.0.linear."
        x = x + ref.medusa_act(ref._column_parallel(x, ref.pp - 1, p + "weight", p + "bias"))
        assert torch.allclose(got[h], ref.logits(x) / ref.semantics.logits_scale, atol=1e-5)


def test_replicas_that_differ_between_ranks_are_refused(tmp_path, qwen2_base, good_ckpt):
    from trtllm_medusa_ports.errors import CheckpointError

    d = _broken(good_ckpt, tmp_path, "replica")
    _rewrite(d, 1, lambda sd: sd.__setitem__("transformer.layers.0.post_layernorm.weight",
                                             sd["transformer.layers.0.post_layernorm.weight"] * 1.5))
    with pytest.raises(CheckpointError, match="'transformer.layers.0.post_layernorm.weight' differs between rank 0"):
        ReferenceModel(d)
    ReferenceModel(good_ckpt)  # the intact checkpoint loads


@pytest.mark.parametrize("dim", [0, 1])
def test_parallel_embedding_splits_verify(tmp_path, llama_base, dim):
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    c = tiny_config("LlamaForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    ckpt = convert_to(tmp_path / "c", llama_base, heads, tp_size=2, use_parallel_embedding=True,
                      embedding_sharding_dim=dim)
    emb = load_file(str(ckpt / "rank1.safetensors"))["transformer.vocab_embedding.weight"]
    assert emb.shape == ((126, 64) if dim == 0 else (251, 32))  # vocab 251 padded to 252 for dim 0
    rep = verify(llama_base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert rep.parity and rep.greedy_equal


def test_verify_prunes_a_preset_and_never_cuts_a_written_tree(tmp_path, qwen2_base, good_ckpt, capsys):
    rep = verify(qwen2_base, good_ckpt, medusa_choices="mc_sim_7b_63", max_new_tokens=6)  # 3 heads
    assert rep.proof_ok and rep.notes == ["preset mc_sim_7b_63 pruned to the depth of 3 Medusa head(s): "
                                    "61 of its 63 nodes kept"]
    assert rep.render().startswith("note: preset mc_sim_7b_63 pruned")
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(good_ckpt),
               "--medusa_choices", "[[0],[0,0],[0,0,0],[0,0,0,0]]"])
    err = capsys.readouterr().err
    assert rc == 1 and "depth 4 but there are only 3 Medusa heads" in err


def test_verify_takes_several_text_prompts(tmp_path, qwen2_base, served_ckpt, capsys):
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer

    save_tiny_tokenizer(tmp_path / "tok", 263)
    args = ["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(served_ckpt), "--medusa_choices", TREE,
            "--tokenizer_dir", str(tmp_path / "tok"), "--max_new_tokens", "4", "--json"]
    assert main(args + ["--prompt", "t5 t6 t7", "--prompt", "t40 t41"]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == [[5, 6, 7], [40, 41]]
    (tmp_path / "p.txt").write_text("t5 t6 t7\n\nt9 t10 t11 t12\n")
    assert main(args + ["--prompts_file", str(tmp_path / "p.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == [[5, 6, 7], [9, 10, 11, 12]]
    (tmp_path / "empty.txt").write_text("\n")
    assert main(args + ["--prompts_file", str(tmp_path / "empty.txt")]) == 1
    assert "no prompts in the file" in capsys.readouterr().err


def test_verify_compares_the_heads_with_their_source(tmp_path, qwen2_base, qwen2_heads, good_ckpt, capsys):
    rep = verify(qwen2_base, good_ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert rep.proof_ok and rep.heads_parity and rep.heads_source == str(qwen2_heads.resolve())
    d = _broken(good_ckpt, tmp_path, "head")
    for r in range(2):  # greedy equivalence holds for any heads: only the heads check can see this
        _rewrite(d, r, lambda sd: sd.__setitem__("medusa_heads.1.medusa_layers.0.linear.weight",
                                                 sd["medusa_heads.1.medusa_layers.0.linear.weight"] + 1e-2))
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=4)
    assert rep.parity and rep.greedy_equal and rep.heads_parity is False and not rep.ok
    assert "heads parity      : FAIL" in rep.render() and "head 1 differs most" in rep.render()
    cfg = json.loads((d / "config.json").read_text())
    cfg["medusa_ports"]["heads_source"] = str(tmp_path / "gone")
    (d / "config.json").write_text(json.dumps(cfg))
    rep = verify(qwen2_base, d, medusa_choices=TREE, max_new_tokens=4)
    assert rep.heads_parity is None and "pass --medusa_model_dir" in rep.render() and not rep.ok  # unaccounted
    rc = main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(d), "--medusa_choices", TREE,
               "--max_new_tokens", "4", "--medusa_model_dir", str(qwen2_heads), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == EXIT_FOUND and out["heads_parity"] is False


def test_a_run_cut_at_the_end_token_counts_the_steps_a_runtime_would_take():
    from trtllm_medusa_ports.reference.decoding import MedusaRun

    # context token 5, then steps emitting 3, 1, 2, 2 tokens: 5 | 6 7 8 | 9 | 2 10 | 11 12
    run = MedusaRun(tokens=[5, 6, 7, 8, 9, 2, 10, 11, 12], steps=4, accepted_per_step=[3, 1, 2, 2])
    assert run.until_end({2}) == (5, 3)  # the end token is the 5th emitted, by step 3
    assert run.until_end({8}) == (3, 1)  # emitted last in step 1
    assert run.until_end({6}) == (1, 1)  # emitted first in step 1: its other tokens are not counted
    assert run.until_end({5}) == (0, 0)  # the context step's token: no step runs
    assert run.until_end({99}) == (8, 4)  # no end token: every step
    assert run.until_end({12, 9}) == (4, 2)  # the first end token of several


def test_gemma3_local_rope_scaling_is_refused_and_verify_shows_the_engine_difference(tmp_path, store):
    """TensorRT-LLM scales Gemma 3's local layers with the global rotary_scaling, transformers does not:
    `check` refuses it, and a checkpoint written anyway fails `verify` (the executor computes as the engine)."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.compat import check_base
    from trtllm_medusa_ports.files.hf_model import HFConfig

    base = tiny_base(store, "Gemma3ForCausalLM", rope_scaling={"rope_type": "linear", "factor": 8.0})
    hf = HFConfig.read(base)
    assert hf.rope_scaling == {"type": "linear", "factor": 8.0}
    assert hf.rope_scaling_for("sliding_attention") is None
    found = [f for f in check_base(hf, adapter_for("Gemma3ForCausalLM")) if f.rule == "engine-divergence"]
    assert len(found) == 1 and found[0].severity == "error" and found[0].overridable
    assert "local layers" in found[0].message and "create_attention_const_params" in found[0].message
    c = tiny_config("Gemma3ForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=3, seed=7), tmp_path / "h")
    with pytest.raises(Exception, match="engine-divergence"):
        convert_to(tmp_path / "refused", base, heads, dtype="float32")
    assert not (tmp_path / "refused").exists()
    ckpt = convert_to(tmp_path / "c", base, heads, dtype="float32", allow_unsupported=True)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert any("engine-divergence" in w for w in cfg["medusa_ports"]["warnings"])
    ref = ReferenceModel(ckpt)
    assert torch.allclose(ref.local_inv_freq.double() * 8.0, 1.0 / (10000.0 ** (torch.arange(0, 32, 2).double() / 32)))
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert not rep.parity and rep.parity_divergence["where"] == "layer 0 output"  # layer 0 is local
    assert "engine-divergence" in rep.render()
    # the same base without rope_scaling is not refused and verifies
    plain = tiny_base(store, "Gemma3ForCausalLM")
    assert not [f for f in check_base(HFConfig.read(plain), adapter_for("Gemma3ForCausalLM"))
                if f.rule == "engine-divergence"]


def test_squared_relu_is_what_transformers_and_tensorrt_llm_compute():
    """TensorRT-LLM's 'squared-relu' / 'relu2' (ACT2FN: relu(x) ** 2) against transformers' relu2."""
    from transformers.activations import ACT2FN

    from trtllm_medusa_ports.reference.executor import activation

    x = torch.linspace(-3, 3, 61)
    for name in ("squared-relu", "relu2"):
        got = activation(name)(x)
        assert torch.equal(got, ACT2FN["relu2"](x)) and torch.equal(got, torch.relu(x) ** 2), name
    assert got[:30].abs().max() == 0 and got[-1] == 9


def test_a_bias_combine_applies_to_the_bias_alone():
    """Deviation(combine=plus_one, bias_combine=first_tensor): a LayerNorm scaling by w + 1 stores w + 1 and its bias
    as it is; without bias_combine the bias takes the weight's combine (a fused q/k/v layout needs that)."""
    from trtllm_medusa_ports.archs.starcoder2 import Starcoder2Adapter
    from trtllm_medusa_ports.archs.weights import (
        NORMS,
        Deviation,
        Place,
        Role,
        first_tensor,
        plus_one,
    )
    from trtllm_medusa_ports.files.hf_model import HFConfig

    class OnePlus(Starcoder2Adapter):
        def deviations(self, hf):
            return {role: Deviation(combine=plus_one, bias_combine=first_tensor) for role in NORMS}

    class Both(Starcoder2Adapter):
        def deviations(self, hf):
            return {Role.INPUT_NORM: Deviation(combine=plus_one)}

    hf = HFConfig(dict(Starcoder2Adapter.tiny_config, architectures=["Starcoder2ForCausalLM"]), Path("config.json"))
    rules = {r.name: r.combine for r in OnePlus().rules_at(Place.LAYER, hf)}
    assert rules["input_layernorm.weight"] is plus_one and rules["input_layernorm.bias"] is first_tensor
    assert rules["post_layernorm.weight"] is plus_one and rules["post_layernorm.bias"] is first_tensor
    final = {r.name: r.combine for r in OnePlus().rules_at(Place.LAST, hf)}
    assert final["transformer.ln_f.weight"] is plus_one and final["transformer.ln_f.bias"] is first_tensor
    both = {r.name: r.combine for r in Both().rules_at(Place.LAYER, hf)}
    assert both["input_layernorm.weight"] is plus_one and both["input_layernorm.bias"] is plus_one


def test_the_checkpoint_remembers_its_tree_and_verify_proves_that_one(tmp_path, qwen2_base, qwen2_heads, capsys):
    """No TensorRT-LLM route reads a tree from the engine: convert records the one it was given, and verify defaults
    to it, says where its tree came from, and refuses another unless asked by name."""
    from trtllm_medusa_ports.errors import ModelError

    ckpt = convert_to(tmp_path / "c", qwen2_base, qwen2_heads, medusa_choices=TREE, max_draft_len=12)
    record = json.loads((ckpt / "config.json").read_text())["medusa_ports"]
    assert record["medusa_choices"] == json.loads(TREE) and record["medusa_choices_from"] == "the tree given"
    rep = verify(qwen2_base, ckpt, max_new_tokens=4)
    assert rep.tree_nodes == 9 and rep.tree_source == "recorded at conversion (the tree given)"
    assert "tree              : 9 nodes, recorded at conversion (the tree given)" in rep.render()
    assert verify(qwen2_base, ckpt, medusa_choices=TREE.replace("],[", "], ["), max_new_tokens=2).tree_nodes == 9
    with pytest.raises(ModelError, match=r"--medusa_choices \(2 nodes\) is not the tree this checkpoint was converted "
                                         r"for \(9 nodes, the tree given\)") as e:
        verify(qwen2_base, ckpt, medusa_choices="[[0],[0,0]]", max_new_tokens=2)
    assert "--override_medusa_choices" in e.value.fix
    other = verify(qwen2_base, ckpt, medusa_choices="[[0],[0,0]]", override_medusa_choices=True, max_new_tokens=2)
    assert other.tree_nodes == 2 and other.tree_source == "given (another than the one recorded at conversion)"
    assert main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(ckpt), "--medusa_choices",
                 "[[1]]", "--max_new_tokens", "2"]) == 1
    assert "is not the tree this checkpoint was converted for" in capsys.readouterr().err
    # a preset is recorded as the paths kept, and says so; no tree given: mc_sim_7b_63, said as such
    preset = convert_to(tmp_path / "p", qwen2_base, qwen2_heads, medusa_choices="mc_sim_7b_63")
    record = json.loads((preset / "config.json").read_text())["medusa_ports"]
    assert len(record["medusa_choices"]) == 61 and record["medusa_choices_from"].startswith("preset mc_sim_7b_63 "
                                                                                             "pruned to the depth of 3")
    plain = convert_to(tmp_path / "n", qwen2_base, qwen2_heads)
    assert "medusa_choices" not in json.loads((plain / "config.json").read_text())["medusa_ports"]
    rep = verify(qwen2_base, plain, max_new_tokens=2, skip_tree_proof=True)
    assert rep.tree_source.startswith("mc_sim_7b_63: the checkpoint records no tree") and rep.tree_nodes == 61


@pytest.mark.parametrize("epsilon", [0.01, 0.2])
def test_sparse_mixer_routing_is_transformers_phimoe_sparsemixer(epsilon):
    """SPARSE_MIXER (reference/routing.py, as moe_kernels.cu sparseMixerMask and the softmax after it route): the
    same experts and weights as transformers' Phi-3.5-MoE ``sparsemixer`` at top-2 (inference), logits spread
    from clustered (several experts within the threshold) to far apart (the mask leaves one)."""
    import dataclasses

    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    from trtllm_medusa_ports.archs.semantics import Semantics
    from trtllm_medusa_ports.reference.routing import route

    g = torch.Generator().manual_seed(0)
    for scale in (0.01, 0.3, 3.0):
        logits = torch.randn(64, 8, generator=g) * scale + 1.0
        want_w, want_i = sparsemixer(logits, jitter_eps=epsilon, training=False, top_k=2)
        sem = dataclasses.replace(Semantics(), moe_top_k=2, moe_sparse_mixer_epsilon=epsilon)
        got_w, got_i = route(logits, sem)
        assert torch.equal(got_i, want_i.reshape(got_i.shape)), scale
        assert torch.allclose(got_w, want_w.reshape(got_w.shape), atol=1e-6, rtol=0), scale
        assert (got_i[:, 0] != got_i[:, 1]).all()
    # the other routings unchanged: RENORMALIZE (softmax over the top-k) and NONE (their share of all)
    logits = torch.randn(5, 6, generator=g)
    top, idx = logits.topk(2, dim=-1)
    w, i = route(logits, dataclasses.replace(Semantics(), moe_top_k=2))
    assert torch.equal(i, idx) and torch.allclose(w, torch.softmax(top, -1))
    w, _ = route(logits, dataclasses.replace(Semantics(), moe_top_k=2, moe_renormalize=False))
    assert torch.allclose(w, torch.softmax(logits, -1).gather(-1, idx))


def test_rope_tables_are_the_engines_float32_table(store, tmp_path):
    """The executor's RoPE table is the engine's float32 one (tensorrt_llm/functional.py RopeEmbeddingUtils:
    float32 inverse frequencies, float32 angles from np.einsum(dtype=float32)): equal angles at every position, where
    a float64 angle differs by ~6e-4 rad at position 131,071 on this table (the issue measured up to 8e-3 on long
    tables): a rounding that grows with the position, which the executor now shares with the engine."""
    import numpy as np
    from conftest import heads_once

    base = tiny_base(store, "LlamaForCausalLM")
    ref = ReferenceModel(convert_to(tmp_path / "c", base, heads_once(base), tp_size=1))
    dim, theta = ref.rotary_dim, float(ref.semantics.rotary_base)
    positions = torch.tensor([0, 1, 4095, 4096, 65535, 131071])
    inv = 1.0 / (theta ** (np.arange(0, dim, 2) / dim)).astype(np.float32)  # upstream's numpy, float32
    angles = np.einsum("i,j->ij", positions.numpy().astype(np.float32), inv, dtype=np.float32)
    assert np.array_equal(ref.inv_freq.numpy(), inv) and ref.inv_freq.dtype == torch.float32
    cos, sin = ref.rotary_tables(positions)[False]
    assert cos.dtype == torch.float32
    assert np.allclose(cos.numpy(), np.cos(angles), rtol=0, atol=2e-7)
    assert np.allclose(sin.numpy(), np.sin(angles), rtol=0, atol=2e-7)
    exact = positions.double()[:, None] * (1.0 / theta ** (torch.arange(0, dim, 2).double() / dim))[None, :]
    assert 2e-4 < float((exact[-1] - torch.from_numpy(angles[-1]).double()).abs().max()) < 1e-2  # the bound, stated
