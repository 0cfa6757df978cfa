"""trtllm-medusa port (issue 78, 1): one command from a base to a verified bundle - every stage's result kept in the
output directory, a rerun reusing each stage whose options and inputs are unchanged, a changed option rerunning its
stage and those after it, the verdict, tokens per step and bundle in the summary and in one JSON object, the exit
codes of every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.api import PortOptions, port
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.prompts import verify_prompts
from trtllm_medusa_ports.files.tokenizer import CHAT_NONE
from trtllm_medusa_ports.fixtures.synthetic import (
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
    train_heads,
)

ARCH = "Qwen2ForCausalLM"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, store) -> tuple[Path, Path, Path]:
    """The demo's base (its embedding gain makes its greedy text learnable), heads trained on it as the demo's, a
    tokenizer of its vocabulary."""
    root = tmp_path_factory.mktemp("port-inputs")
    base = tiny_base(store, ARCH, embedding_gain=16.0, tie_word_embeddings=False)
    vocab = tiny_config(ARCH).vocab_size
    heads = save_heads(train_heads(base, num_heads=3, num_layers=1, positions_per_step=256, steps=60, quiet=True),
                       root / "heads")
    return base, heads, save_tiny_tokenizer(root / "tok", vocab)


def _statuses(result) -> dict[str, str]:
    return {s.stage: s.status for s in result.stages}


def test_port_runs_every_stage_then_reuses_what_did_not_change(tmp_path, inputs, capsys):
    base, heads, tok = inputs
    stages = {"check": {"tp_size": 2}, "convert": {"tp_size": 2}, "verify": {"max_new_tokens": 8},
              "tune-tree": {"prompts": api.PromptInputs(prompt_ids=[[1, 2, 3], [4, 5, 6, 7]]), "new_tokens": 8},
              "deploy": {"max_batch_size": 4}}
    out = tmp_path / "out"
    first = port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, stages=stages))
    assert _statuses(first) == {"check": "ran", "train-heads": "skipped", "tune-tree": "ran", "convert": "ran",
                                "verify": "ran", "deploy": "ran"}
    assert first.compatible and first.verified and first.exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "checkpoint", "convert.json", "deploy.json",
                                                     "port.json", "serve", "tree.json", "tune.json", "verify.json"]
    tree = json.loads((out / "tree.json").read_text())
    ckpt = json.loads((out / "checkpoint" / "config.json").read_text())
    assert ckpt["mapping"]["tp_size"] == 2 and ckpt["medusa_ports"]["medusa_choices"] == tree  # tuned, at tp 2
    bundle = json.loads((out / "serve" / "deploy.json").read_text())
    assert bundle["serving"]["max_batch_size"] == 4 and first.bundle == (out / "serve").resolve()
    verify = json.loads((out / "verify.json").read_text())
    assert verify["ok"] and first.tokens_per_step_until_end == verify["tokens_per_step_until_end"] > 1
    # verify measures on the packaged verify prompts (tune-tree's kinds, in neither's files), as text
    assert len(verify["prompts"]) == len(verify_prompts()) and verify["chat_template"] == CHAT_NONE
    tuned = json.loads((out / "tune.json").read_text())["predicted_tokens_per_step_until_end"]
    assert first.predicted_tokens_per_step_until_end == tuned and f"tune-tree predicted {tuned:.2f}" in first.render()
    assert first.measured_on == f"{len(verify_prompts())} text prompt(s), the chat template {CHAT_NONE}"
    err = capsys.readouterr().err
    assert "[1/6] check: done in" in err and "[2/6] train-heads: skipped (--medusa_model_dir given)" in err
    assert "[6/6] deploy: done in" in err
    text = first.render()
    assert text.startswith("port: VERIFIED") and "tokens per step until the end token" in text
    assert f"next: copy {out.resolve() / 'serve'} to the GPU machine" in text

    again = port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, stages=stages, quiet=True))
    assert set(_statuses(again).values()) == {"reused", "skipped"}
    assert again.to_dict() | {"stages": None} == first.to_dict() | {"stages": None}  # the same summary, read back
    stages["verify"]["max_new_tokens"] = 6  # verify's option: verify and deploy run again, the rest is reused
    changed = port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, stages=stages, quiet=True))
    assert _statuses(changed) == {"check": "reused", "train-heads": "skipped", "tune-tree": "reused",
                                  "convert": "reused", "verify": "ran", "deploy": "ran"}
    (out / "checkpoint" / "config.json").unlink()  # an output gone is made again, and what comes after it
    rebuilt = port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, stages=stages, quiet=True))
    assert [s.stage for s in rebuilt.stages if s.status == "ran"] == ["convert", "verify", "deploy"]
    everything = port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, stages=stages, quiet=True,
                                  overwrite=True))
    assert "reused" not in _statuses(everything).values()


def test_port_trains_heads_when_none_are_given_and_prints_one_json_object(tmp_path, inputs, capsys):
    base, _, tok = inputs
    out = tmp_path / "out"
    argv = ["port", str(base), "--output_dir", str(out), "--tokenizer_dir", str(tok), "--medusa_choices",
            "mc_sim_7b_63", "--steps", "5", "--num_heads", "2", "--prompt_ids", "1,2,3;4,5,6;7,8,9", "--new_tokens",
            "8", "--json", "--quiet"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert [s["status"] for s in got["stages"]] == ["ran", "ran", "skipped", "ran", "ran", "ran"]
    assert got["verified"] is True and got["exit_code"] == 0 and got["bundle"] == str((out / "serve").resolve())
    trained = json.loads((out / "train.json").read_text())
    assert trained["steps"] == 5 and trained["sequences"] == 3  # the flags reached train-heads
    verified = json.loads((out / "verify.json").read_text())  # answers as long as tune-tree's (--new_tokens)
    assert verified["tokens_generated"] == 8 * len(verify_prompts()) == 8 * len(verified["prompts"])
    assert json.loads((out / "heads" / "config.json").read_text())["medusa_num_heads"] == 2
    assert json.loads((out / "checkpoint" / "config.json").read_text())["num_medusa_heads"] == 2
    assert main(argv) == 0  # a rerun: every stage that ran is reused
    assert [s["status"] for s in json.loads(capsys.readouterr().out)["stages"]] == [
        "reused", "reused", "skipped", "reused", "reused", "reused"]


def test_port_stops_with_the_verdict_or_the_stage_that_failed(tmp_path, store, inputs, capsys):
    base, heads, tok = inputs
    bloom = tiny_base(store, "BloomForCausalLM")  # ALiBi: NOT COMPATIBLE, exit 3, nothing after check
    out = tmp_path / "bloom"
    assert main(["port", str(bloom), "--output_dir", str(out), "--medusa_model_dir", str(heads), "--quiet"]) == 3
    assert "port: NOT COMPATIBLE (check.json)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "port.json"]
    # a stage's error names the stage; the stages before it are kept for the rerun
    out = tmp_path / "tune"
    with pytest.raises(PortError) as e:
        port(PortOptions(base, out, medusa_model_dir=heads, tokenizer_dir=tok, quiet=True,
                         stages={"tune-tree": {"prompts": api.PromptInputs(prompt_ids=[[1, 99999]])}}))
    assert "--prompt_ids prompt 0: token ids [99999] are outside the vocabulary" in e.value.what
    assert any("port stopped at its tune-tree stage" in n for n in e.value.__notes__)
    assert list(json.loads((out / "port.json").read_text())["stages"]) == ["check"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    assert main(["port", str(base), "--output_dir", str(foreign), "--medusa_model_dir", str(heads)]) == 1
    assert "holds no port.json" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["mine.txt"]
    with pytest.raises(PortError, match="sets output_dir, which port sets itself"):
        port(PortOptions(base, tmp_path / "x", medusa_model_dir=heads, stages={"convert": {"output_dir": "y"}}))
    with pytest.raises(PortError, match="names no stage build"):
        port(PortOptions(base, tmp_path / "x", medusa_model_dir=heads, stages={"build": {}}))


def test_tune_tree_names_a_packaged_prompt_its_tokenizer_empties(tmp_path, inputs, monkeypatch):
    """A tokenizer that turns one of the packaged held-out prompts into no ids was an IndexError inside transformers'
    generate (found by port on a tiny tokenizer); it is named, exit 1."""
    from trtllm_medusa_ports.files import prompts

    base, heads, tok = inputs
    monkeypatch.setattr(prompts, "heldout_prompts", lambda: ["t1 t2", ""])
    with pytest.raises(PortError) as e:
        api.tune_tree(api.TuneOptions(model_dir=base, medusa_model_dir=heads, tokenizer_dir=tok, quiet=True))
    assert "packaged held-out prompt 1 is empty" in e.value.what and e.value.exit_code == 1


def test_port_passes_each_flag_to_the_stages_that_have_it():
    """A flag goes to every stage declaring it (declared.port_routes) but --dtype (check and convert: train-heads
    computes in its own), the text inputs (train-heads alone) and calibration (convert); train-heads' fit flags
    nest under "fit"; a flag not given reaches no stage, which keeps its own default."""
    from trtllm_medusa_ports.cli import build_parser
    from trtllm_medusa_ports.cli_flags.values import port_stages

    p = build_parser("port")
    args = p.parse_args(["port", "b", "--output_dir", "o", "--no_streaming", "--steps", "9", "--batch_size", "0",
                         "--tp_size", "2", "--dtype", "bfloat16", "--prompt", "hi", "--max_seq_len", "512",
                         "--max_new_tokens", "7", "--calib_size", "8", "--threads", "1"])
    got = port_stages(args)
    assert got["check"] == {"tp_size": 2, "dtype": "bfloat16", "max_seq_len": 512, "threads": 1}
    assert got["convert"] == {"tp_size": 2, "dtype": "bfloat16", "calib_size": 8, "threads": 1}
    assert got["train-heads"]["fit"] == {"steps": 9, "batch_size": None}
    assert got["train-heads"]["streaming"] is False and got["train-heads"]["prompts"].prompt == ["hi"]
    assert got["verify"] == {"streaming": False, "max_new_tokens": 7, "threads": 1}
    assert got["deploy"] == {"max_seq_len": 512} and got["tune-tree"] == {"threads": 1}
    assert port_stages(p.parse_args(["port", "b", "--output_dir", "o"])) == {}
    from trtllm_medusa_ports.cli_flags.values import (
        options_from,  # train-heads itself reads --batch_size 0 the same
    )

    own = build_parser("train-heads").parse_args(["train-heads", "--model_dir", "m", "--output_dir", "o",
                                                  "--batch_size", "0"])
    assert options_from("FitOptions", own)["batch_size"] is None
    with pytest.raises(SystemExit):  # port's own paths are not a stage's: --checkpoint_dir is no port flag
        p.parse_args(["port", "b", "--output_dir", "o", "--checkpoint_dir", "c"])
