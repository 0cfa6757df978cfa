"""Our engine class gives every tree token of a learned-position base (every family declaring learned absolute
positions: GPT-2, GPTBigCode, OPT) its own position id: the runtime's inputs as upstream fills them
(tests/standin/runtime_buffers.py) go through the class on the stand-in, whose GPTModel and OPTModel record the ids
they embed (tests/standin/LEDGER.md)."""

import pytest
import torch
from standin_import import standin_file
from test_engine import _checkpoint, _engine_model, trtllm  # noqa: F401  (trtllm: the stand-in fixture)

from trtllm_medusa_ports.archs import registry
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.trees.tree import MedusaTree

#: every family with learned absolute positions (a family added with them is covered without naming it here)
LEARNED = sorted(cls.hf_architectures[0] for cls in dict.fromkeys(registry().values())
                 if cls.position_embedding is PositionEmbedding.LEARNED_ABSOLUTE)
STAGED = [a for a in LEARNED if registry()[a].engine_pipeline_parallel]

# loaded from its file: putting tests/standin on sys.path would make the stand-in's tensorrt_llm importable to
# every test of the worker (tests/test_engine.py checks that it is not)
_buffers = standin_file("runtime_buffers.py", "standin_runtime_buffers")
ContextRequest, GenerationRequest, medusa_step_inputs = (_buffers.ContextRequest, _buffers.GenerationRequest,
                                                         _buffers.medusa_step_inputs)

TREE = MedusaTree.from_spec("[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]", num_heads=3)
OFFSETS = TREE.position_offsets  # root 0, then each node's depth


def _embedded_positions(model, requests):
    import tensorrt_llm
    from tensorrt_llm.functional import Tensor
    from tensorrt_llm.layers.attention import KeyValueCacheParams, SpecDecodingParams

    ids, positions, offsets, expected = medusa_step_inputs(requests, OFFSETS)
    tensorrt_llm.CALLS.clear()
    spec = SpecDecodingParams(spec_decoding_max_generation_length=len(OFFSETS),
                              spec_decoding_position_offsets=Tensor("spec_decoding_position_offsets", offsets))
    model.forward(input_ids=Tensor("input_ids", ids), position_ids=Tensor("position_ids", positions), use_cache=True,
                  last_token_ids=Tensor("last_token_ids"), kv_cache_params=KeyValueCacheParams(),
                  spec_decoding_params=spec)
    got = [c[1] for c in tensorrt_llm.CALLS if c[0] == "position_ids"]
    assert len(got) == 1
    return list(got[0]), expected


@pytest.mark.parametrize("arch", LEARNED)
@pytest.mark.parametrize("batch", ["one generation request", "mixed", "context only", "several generation requests"])
def test_every_tree_token_is_embedded_at_its_own_position(trtllm, store, tmp_path, arch, batch):  # noqa: F811
    requests = {
        "one generation request": [GenerationRequest(9, 5, [6, 7, 8, 9, 10, 11])],
        "mixed": [ContextRequest([1, 2, 3, 4]), ContextRequest([5, 6], begin=3),
                  GenerationRequest(12, 5, [6, 7, 8, 9, 10, 11]), GenerationRequest(30, 1, [2, 3, 4, 5, 6, 7])],
        "context only": [ContextRequest([1, 2, 3, 4, 5])],
        "several generation requests": [GenerationRequest(4, 5, [1] * 6), GenerationRequest(17, 2, [3] * 6)],
    }[batch]
    model = _engine_model(_checkpoint(store, tmp_path, arch))
    got, expected = _embedded_positions(model, requests)
    assert got == expected


def test_every_learned_position_family_is_covered():
    assert {"GPT2LMHeadModel", "GPTBigCodeForCausalLM", "OPTForCausalLM"} <= set(LEARNED)
    assert "OPTForCausalLM" not in STAGED  # OPTModel has no pipeline stages


@pytest.mark.parametrize("batch", ["one generation request", "mixed"])
def test_a_class_that_keeps_the_runtimes_ids_fails(trtllm, store, tmp_path, monkeypatch, batch):  # noqa: F811
    """Without the rebuild: one request embeds every tree token at the root's position (TensorRT broadcasts the one
    id), several fail on mismatched lengths - the two failures upstream's own classes would have."""
    import trtllm_medusa_ports.engine.medusa as medusa

    monkeypatch.setattr(medusa, "tree_position_ids", lambda position_ids, offsets: position_ids)
    model = _engine_model(_checkpoint(store, tmp_path, "GPT2LMHeadModel"))
    if batch == "one generation request":
        got, expected = _embedded_positions(model, [GenerationRequest(9, 5, [6, 7, 8, 9, 10, 11])])
        assert got == [8] * 7 and expected == [8, 9, 9, 10, 10, 10, 11]
    else:
        with pytest.raises(ValueError, match="cannot broadcast"):
            _embedded_positions(model, [ContextRequest([1, 2, 3]), GenerationRequest(12, 5, [6] * 6)])


def test_the_rebuild_is_upstreams_shape_arithmetic():
    """The runtime model itself: one id per generation request, the offsets the tree's depths."""
    ids, positions, offsets, expected = medusa_step_inputs(
        [ContextRequest([1, 2]), GenerationRequest(5, 3, [4] * 6)], OFFSETS)
    assert ids.shape == (2 + 7,) and positions.tolist() == [0, 1, 4] and offsets.tolist() == [OFFSETS]
    assert expected == [0, 1] + [4 + o for o in OFFSETS] and positions.dtype == torch.int32


def test_build_refuses_padded_inputs_for_a_learned_position_base(trtllm, store, tmp_path, capsys):  # noqa: F811
    """The rebuild reads the runtime's packed 1-D position ids; --remove_input_padding disable gives [batch, T] ids,
    which it cannot take (issue 57, m2): build refuses the flag for learned-position bases only."""
    from test_engine import _build

    gpt2 = _checkpoint(store, tmp_path, "GPT2LMHeadModel")
    assert _build(gpt2, tmp_path / "eng", "--remove_input_padding", "disable") == 1
    err = capsys.readouterr().err
    assert "--remove_input_padding disable" in err and "engine/positions.py" in err and not (tmp_path / "eng").exists()
    llama = _checkpoint(store, tmp_path, "LlamaForCausalLM", name="llama")
    assert _build(llama, tmp_path / "eng2", "--remove_input_padding", "disable") == 0  # RoPE: no rebuild, no refusal


@pytest.mark.parametrize("arch", STAGED)
def test_the_first_pipeline_stage_embeds_every_tree_tokens_own_position(trtllm, store, tmp_path, arch):  # noqa: F811
    """pp 2 (issue 57, m4): the position table is read on the first stage only, so the rebuild belongs there; the
    last stage embeds nothing. A rebuild moved to the last stage would leave the first stage embedding the runtime's
    one id per request."""
    ckpt = _checkpoint(store, tmp_path, arch, pp=2)
    requests = [ContextRequest([1, 2, 3]), GenerationRequest(12, 5, [6, 7, 8, 9, 10, 11])]
    got, expected = _embedded_positions(_engine_model(ckpt, rank=0), requests)
    assert got == expected == [0, 1, 2] + [11 + o for o in OFFSETS]
    import tensorrt_llm
    from tensorrt_llm.functional import Tensor
    from tensorrt_llm.layers.attention import KeyValueCacheParams, SpecDecodingParams

    ids, positions, offsets, _ = medusa_step_inputs(requests, OFFSETS)
    tensorrt_llm.CALLS.clear()
    last = _engine_model(ckpt, rank=1)
    spec = SpecDecodingParams(spec_decoding_max_generation_length=len(OFFSETS),
                              spec_decoding_position_offsets=Tensor("spec_decoding_position_offsets", offsets))
    last.forward(input_ids=Tensor("input_ids", ids), position_ids=Tensor("position_ids", positions), use_cache=True,
                 last_token_ids=Tensor("last_token_ids"), kv_cache_params=KeyValueCacheParams(),
                 spec_decoding_params=spec, hidden_states=Tensor("hidden_states"))
    assert not [c for c in tensorrt_llm.CALLS if c[0] == "position_ids"]  # the last stage embeds no positions


def test_build_and_deploy_keep_tree_tokens_inside_the_position_table(store, tmp_path, capsys, monkeypatch):
    """Issue 64, 4: trtllm-build's default max_seq_len is the whole position table, so the last steps' tree tokens
    ran past it while check said learned-position-range. build passes the table less the tree's depth where no
    --max_seq_len is given and refuses a larger one; deploy defaults to it and refuses a larger one (the same rule)."""
    import json

    from trtllm_medusa_ports.cli import main
    from trtllm_medusa_ports.engine import build as engine_build
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    ckpt = _checkpoint(store, tmp_path, "GPT2LMHeadModel")
    cfg = json.loads((ckpt / "config.json").read_text())
    table = cfg["max_position_embeddings"]
    depth = max(map(len, cfg["medusa_ports"]["medusa_choices"])) if cfg["medusa_ports"].get("medusa_choices") \
        else cfg["num_medusa_heads"]
    seen = []
    monkeypatch.setattr(engine_build, "main", lambda ck, args, allow_unsupported=False: seen.append(args) or 0)
    assert main(["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "eng")]) == 0
    assert seen[-1][-2:] == ["--max_seq_len", str(table - depth)]
    assert f"note: --max_seq_len {table - depth}" in capsys.readouterr().err
    assert main(["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "eng"),
                 f"--max_seq_len={table - depth}"]) == 0 and seen[-1][-1] == f"--max_seq_len={table - depth}"
    assert main(["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "eng"),
                 "--max_seq_len", str(table)]) == 1
    err = capsys.readouterr().err
    assert "[learned-position-range]" in err and f"--max_seq_len {table - depth} or less" in err and len(seen) == 2

    tok = save_tiny_tokenizer(tmp_path / "tok", tiny_config("GPT2LMHeadModel").vocab_size)
    args = ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--json"]
    assert main([*args, "--output_dir", str(tmp_path / "serve")]) == 0
    bundle = json.loads(capsys.readouterr().out)
    limit = table - max(map(len, bundle["tree"]["medusa_choices"]))  # the served tree's depth
    assert bundle["serving"]["max_seq_len"] == limit
    run = bundle["run"]["argv"]
    assert run[run.index("--max_input_length") + 1] == str(bundle["serving"]["max_input_len"])  # run.py cuts to 923
    assert main([*args, "--output_dir", str(tmp_path / "serve2"), "--max_seq_len", str(limit + 1)]) == 1
    err = capsys.readouterr().err
    assert "[learned-position-range]" in err and str(ckpt / "config.json") in err and not (tmp_path / "serve2").exists()
