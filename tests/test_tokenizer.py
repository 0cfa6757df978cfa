"""The missing-tokenizer message, one for every command that reads a tokenizer (issue 65, 3; files/tokenizer.py):
a base directory without tokenizer files gave train-heads and verify --prompt "token ids (empty) are outside the
vocabulary" while deploy said what was missing."""

import pytest
from conftest import tiny_base

from trtllm_medusa_ports.cli import main

SAID = "no tokenizer there (none of tokenizer.json, tokenizer.model, spiece.model, sentencepiece.bpe.model, " \
       "vocab.json, vocab.txt)"


@pytest.fixture
def bare(store):
    """A base with weights and config.json, and no tokenizer."""
    base = tiny_base(store, "Qwen2ForCausalLM")
    assert not any((base / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
    return base


def _commands(base, tmp_path):
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    c = tiny_config("Qwen2ForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2), tmp_path / "heads")
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir", str(ckpt),
                 "--quiet"]) == 0
    return {
        "train-heads": ["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h"), "--steps", "1",
                        "--quiet"],
        "verify --prompt": ["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--prompt", "Hi"],
        "check --prompt": ["check", "--model_dir", str(base), "--prompt", "Hi"],
        "tune-tree": ["tune-tree", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output",
                      str(tmp_path / "t.json"), "--quiet"],
        "convert calibration": ["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                                str(tmp_path / "q"), "--qformat", "fp8", "--calib_size", "2", "--quiet"],
        "deploy": ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(base), "--output_dir",
                   str(tmp_path / "serve")],
    }


def test_every_command_says_the_same_of_a_missing_tokenizer(bare, tmp_path, capsys):
    for name, argv in _commands(bare, tmp_path).items():
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 1, (name, err)
        assert f"error: {bare}: {SAID}" in err, (name, err)
        assert "outside the vocabulary" not in err and "Traceback" not in err, (name, err)
        assert ("--tokenizer_dir" in err.split("fix:")[1]), (name, err)


def test_an_empty_prompt_is_named_empty_not_outside_the_vocabulary():
    """Issue 76, D: an empty tokenization (an empty text, a chat template rendering nothing) is named as such."""
    import pytest

    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.files.prompts import check_ids

    with pytest.raises(PortError) as e:
        check_ids([[1, 2], []], 100)
    assert "prompt 1 is empty: no token ids" in e.value.what and "outside" not in e.value.what
    with pytest.raises(PortError) as e:
        check_ids([[1, 200]], 100)
    assert "prompt 0: token ids [200] are outside the vocabulary 0..99" in e.value.what
