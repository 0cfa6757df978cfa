"""Flags that contradict each other or cannot apply, refused at once under their own names (issue: nothing
silently wrong): each case changes one thing from a working command; inputs are hashed before and after, and
nothing but the output is left beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import ConversionError, TreeError
from trtllm_medusa_ports.files.checkpoint import HIDDEN_STEM_BYTES, hidden_stem
from trtllm_medusa_ports.quant import resolve_spec


def _digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# -- contradictions in the quantization flags --------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(use_weight_only=True), dict(use_weight_only=True, weight_only_precision="int4")])
def test_full_precision_and_weight_only_contradict(kw):
    with pytest.raises(ConversionError, match="--qformat full_prec and --use_weight_only") as e:
        resolve_spec(qformat="full_prec", **kw)
    assert "drop --qformat full_prec" in e.value.fix
    assert resolve_spec(**kw).quant_algo in ("W8A16", "W4A16")  # without full_prec the same flags are weight-only


def test_convert_refuses_full_precision_with_weight_only(tmp_path, capsys, qwen2_base, qwen2_heads):
    inputs = {p: _digest(p) for p in (qwen2_base, qwen2_heads)}
    rc = main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--output_dir",
               str(tmp_path / "out"), "--qformat", "full_prec", "--use_weight_only", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--qformat full_prec and --use_weight_only (weight-only int8) ask for two formats" in err, err
    assert list(tmp_path.iterdir()) == [] and {p: _digest(p) for p in inputs} == inputs


# -- names near the file-name limit ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["d" * 240, "é" * 127, "ckpt"], ids=["240-ascii", "127-two-byte", "short"])
def test_the_hidden_names_beside_an_output_stay_within_the_file_name_limit(name):
    stem = hidden_stem(name)
    assert len(f".{stem}.partial-abcdefgh".encode()) <= 255 and len(f".{stem}.lock".encode()) <= 255
    if len(name.encode()) <= HIDDEN_STEM_BYTES:
        assert stem == name
    else:  # shortened, told apart from another long name by the digest
        assert stem != name and hidden_stem(name[:-1] + "x") != stem and name.startswith(stem[:50])


def test_a_legal_long_output_name_converts(tmp_path, capsys, qwen2_base, qwen2_heads):
    out = tmp_path / ("d" * 240)
    rc = main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--output_dir",
               str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "config.json").is_file() and (out / "rank0.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no lock or partial left beside it


# -- tune-tree: the baseline tree refused before anything is measured ---------------------------------------------
@pytest.mark.parametrize("baseline, needle", [
    ("bogus", "not a preset name"),
    ("[[0], [5, 0]]", "has no parent"),
    ("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]", "depth 4"),
])
def test_tune_tree_refuses_a_bad_baseline_before_measuring(tmp_path, capsys, monkeypatch, qwen2_base, qwen2_heads,
                                                           baseline, needle):
    import trtllm_medusa_ports.huggingface.model as base_model

    def never(*a, **k):
        raise AssertionError("the base was loaded before --baseline was checked")

    monkeypatch.setattr(base_model, "load_base", never)
    rc = main(["tune-tree", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--prompt_ids",
               "1,2,3", "--baseline", baseline, "--output", str(tmp_path / "t.json"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "error: --baseline" in err and needle in err and "--baseline ''" in err, err
    assert "--medusa_choices" not in err.split("fix:")[0] and not (tmp_path / "t.json").exists()


def test_tune_tree_baseline_prunes_a_preset_to_the_heads():
    from trtllm_medusa_ports.trees.tune import baseline_tree

    paths = baseline_tree("mc_sim_7b_63", 2)
    assert paths and max(len(p) for p in paths) == 2
    with pytest.raises(TreeError, match="depth 3"):
        baseline_tree("[[0], [0, 0], [0, 0, 0]]", 2)


# -- train-heads: the base's context by its family's own key, the device by computing on it -------------------------
def test_train_heads_reads_the_context_from_the_familys_own_key(tmp_path, capsys, store):
    from conftest import tiny_base

    base = tiny_base(store, "GPT2LMHeadModel")  # n_positions 256, no max_position_embeddings
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt_ids": [' + ", ".join(["5"] * 250) + "]}\n")
    rc = main(["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--data", str(data),
               "--new_tokens", "10", "--steps", "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "prompt 0 has 250 tokens; with --new_tokens 10 it passes the base's n_positions 256" in err, err
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("device", ["cuda:7", "meta", "bogus"])
def test_train_heads_api_checks_the_device_by_computing_on_it(tmp_path, qwen2_base, device):
    from trtllm_medusa_ports.api import TrainOptions, train_heads
    from trtllm_medusa_ports.errors import PortError

    with pytest.raises(PortError, match="--device"):
        train_heads(TrainOptions(model_dir=qwen2_base, output_dir=tmp_path / "h", device=device))
    assert not (tmp_path / "h").exists()
