"""verify keeps the last base's transformers results (verify/hf_memo.py): a second verify of the same base on the same
inputs reuses them and reports what a fresh run reports; any change to what they are computed from computes them
again."""

from __future__ import annotations

import shutil

import pytest
from conftest import convert_to, family_checkpoint, heads_once, tiny_base

from trtllm_medusa_ports.verify import hf_memo, run, verify

ARGS = dict(medusa_choices="[[0],[1],[0,0]]", max_new_tokens=3, quiet=True, streaming=False)


@pytest.fixture
def loads(monkeypatch) -> list:
    """Every load of the transformers model verify makes, from an empty memo."""
    hf_memo.forget()
    seen: list = []
    real = run.load_hf_model

    def counted(*a, **k):
        seen.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(run, "load_hf_model", counted)
    yield seen
    hf_memo.forget()


def _fresh(base, ckpt, **kw) -> dict:
    hf_memo.forget()
    return verify(base, ckpt, **{**ARGS, **kw}).to_dict()


def test_a_second_checkpoint_of_the_base_reuses_its_results_and_reports_as_a_fresh_run(loads):
    base, tp1 = family_checkpoint("LlamaForCausalLM", 1)
    _, tp2 = family_checkpoint("LlamaForCausalLM", 2)
    first = verify(base, tp1, **ARGS).to_dict()
    second = verify(base, tp2, **ARGS).to_dict()
    assert loads == [base]  # the tp 2 verify did not load the base
    assert first["parity"] and second == _fresh(base, tp2)
    assert second["parity"] and second["greedy_equal"] and second["tree_proof"]["ok"]
    assert second["heads_parity"] is True  # the source heads' logits came along


def test_other_prompts_tokens_or_heads_compute_again(loads):
    base, ckpt = family_checkpoint("Qwen2ForCausalLM", 2)
    verify(base, ckpt, **ARGS)
    verify(base, ckpt, **{**ARGS, "prompts": [[3, 4, 5, 6]]})
    verify(base, ckpt, **{**ARGS, "prompts": [[3, 4, 5, 6]], "max_new_tokens": 4})
    assert len(loads) == 3
    other = heads_once(base, seed=99)
    rep = verify(base, ckpt, **{**ARGS, "prompts": [[3, 4, 5, 6]], "max_new_tokens": 4, "medusa_model_dir": other})
    assert len(loads) == 4 and rep.heads_parity is False  # compared with the other heads, not the kept logits
    verify(base, ckpt, **{**ARGS, "prompts": [[3, 4, 5, 6]], "max_new_tokens": 4, "medusa_model_dir": other,
                          "streaming": True})
    assert len(loads) == 5  # streaming neither keeps nor reuses


def test_a_base_rewritten_in_place_is_loaded_again_and_its_damage_seen(loads, tmp_path):
    from safetensors.torch import load_file, save_file

    shared = tiny_base(tmp_path, "LlamaForCausalLM")
    base = tmp_path / "base"
    shutil.copytree(shared, base)
    ckpt = convert_to(tmp_path / "ckpt", base, heads_once(shared), tp_size=2)
    assert verify(base, ckpt, **ARGS).parity
    weights = load_file(base / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"] *= 1.5
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    rep = verify(base, ckpt, **ARGS)
    assert len(loads) == 2 and not rep.parity


def test_file_identity_changes_with_any_file_of_a_directory_or_a_single_file(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"1234")
    (d / "sub" / "b.bin").write_bytes(b"x")
    before = hf_memo.file_identity(d)
    assert [e[0] for e in before[1]] == ["a.bin", "sub/b.bin"]
    (d / "sub" / "b.bin").write_bytes(b"yy")
    assert hf_memo.file_identity(d) != before
    one = d / "a.bin"
    first = hf_memo.file_identity(one)
    assert first[1][0][:2] == ("a.bin", 4)
    one.unlink()
    one.write_bytes(b"4321")  # same size, a new file
    assert hf_memo.file_identity(one) != first
    assert hf_memo.file_identity(tmp_path / "missing") is None
