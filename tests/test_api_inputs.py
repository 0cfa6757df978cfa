"""The Python API validates its inputs at its own boundary (docs/api.md "Input validation"): a wrong type or an
out-of-range value raises the project's PortError naming ``Class.field``, before any work, instead of a TypeError
from deep inside or a value written into config.json; ``api.build`` raises for a missing or refused checkpoint;
``HeadsInfo.to_dict()`` has one type per key."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from trtllm_medusa_ports import api
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import (
    CheckpointError,
    ConversionError,
    HeadsError,
    PortError,
    TreeError,
)
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

M, H, C = Path("no-model"), Path("no-heads"), Path("no-ckpt")


def _convert(**kw):
    return api.convert(api.ConvertOptions(**{"model_dir": M, "medusa_model_dir": H, "output_dir": Path("o"), **kw}))


def _add_heads(**kw):
    return api.add_heads(api.AddHeadsOptions(**{"base_checkpoint_dir": C, "medusa_model_dir": H, **kw}))


def _check(**kw):
    return api.check(api.CheckOptions(**{"model_dir": M, **kw}))


def _verify(**kw):
    return api.verify(api.VerifyOptions(**{"model_dir": M, "checkpoint_dir": C, **kw}))


def _tune(**kw):
    return api.tune_tree(api.TuneOptions(**{"model_dir": M, "medusa_model_dir": H, "output": Path("t.json"), **kw}))


def _tree(**kw):
    return api.tree(api.TreeOptions(**{"choices": "mc_sim_7b_63", **kw}))


def _train(fit=None, **kw):
    fit = api.FitOptions(**(fit or {}))
    return api.train_heads(api.TrainOptions(**{"model_dir": M, "output_dir": Path("o"), "fit": fit, **kw}))


def _build(**kw):
    return api.build(api.BuildOptions(**{"checkpoint_dir": C, **kw}))


#: (call, its keyword arguments, the error type, its where, words its message holds)
BAD = [
    # None where a value is required
    (_convert, dict(model_dir=None), ConversionError, "ConvertOptions.model_dir", "None (NoneType) is not a path"),
    (_convert, dict(output_dir=None), ConversionError, "ConvertOptions.output_dir", "is not a path"),
    (_add_heads, dict(base_checkpoint_dir=None), ConversionError, "AddHeadsOptions.base_checkpoint_dir",
     "is not a path"),
    (_check, dict(model_dir=None), PortError, "CheckOptions.model_dir", "is not a path"),
    (_verify, dict(checkpoint_dir=None), PortError, "VerifyOptions.checkpoint_dir", "is not a path"),
    (_tune, dict(medusa_model_dir=None), PortError, "TuneOptions.medusa_model_dir", "is not a path"),
    (_train, dict(output_dir=None), PortError, "TrainOptions.output_dir", "is not a path"),
    (_build, dict(checkpoint_dir=None), CheckpointError, "BuildOptions.checkpoint_dir", "is not a path"),
    (_convert, dict(dtype=None), ConversionError, "ConvertOptions.dtype", "is not one of 'auto'"),
    (_verify, dict(max_new_tokens=None), PortError, "VerifyOptions.max_new_tokens", "is not an integer"),
    # a string for an int
    (_convert, dict(tp_size="2"), ConversionError, "ConvertOptions.tp_size", "--tp_size '2' (str) is not an integer"),
    (_convert, dict(calib_size="8"), ConversionError, "ConvertOptions.calib_size", "'8' (str) is not an integer >= 1"),
    (_check, dict(pp_size="2"), PortError, "CheckOptions.pp_size", "'2' (str) is not an integer"),
    (_verify, dict(max_new_tokens="8"), PortError, "VerifyOptions.max_new_tokens", "is not an integer"),
    (_verify, dict(min_quant_agreement=1.5), PortError, "VerifyOptions.min_quant_agreement", "1.5"),
    (_verify, dict(max_memory=float("inf")), PortError, "VerifyOptions.max_memory", "inf"),
    (_verify, dict(min_quant_agreement="0.5"), PortError, "VerifyOptions.min_quant_agreement", "(str)"),
    (_tune, dict(top_k="10"), PortError, "TuneOptions.top_k", "is not an integer in 1..1000"),
    (_tree, dict(top_k="10"), TreeError, "TreeOptions.top_k", "'10' (str) is not an integer"),
    (_train, dict(fit=dict(steps="3")), PortError, "TrainOptions.fit.steps", "'3' (str) is not an integer >= 1"),
    # a bool is not an int (tp_size=True was written into config.json as true)
    (_convert, dict(tp_size=True), ConversionError, "ConvertOptions.tp_size", "True (bool) is not an integer"),
    (_add_heads, dict(max_draft_len=True), ConversionError, "AddHeadsOptions.max_draft_len", "(bool) is not an integer"),
    (_check, dict(tp_size=True), PortError, "CheckOptions.tp_size", "(bool) is not an integer"),
    (_tree, dict(num_heads=False), TreeError, "TreeOptions.num_heads", "(bool) is not an integer"),
    (_verify, dict(calib_size=True), PortError, "VerifyOptions.calib_size", "(bool) is not an integer >= 1"),
    # 0 / -1 / too large where the flag's range (cli.py _int_in) says so
    (_convert, dict(calib_size=0), ConversionError, "ConvertOptions.calib_size", "--calib_size 0 (int) is not an "
     "integer >= 1"),
    (_convert, dict(threads=0), ConversionError, "ConvertOptions.threads", "--threads 0"),
    (_verify, dict(threads=-1), PortError, "VerifyOptions.threads", "--threads -1 (int) is not an integer >= 1"),
    (_verify, dict(calib_max_seq_length=0), PortError, "VerifyOptions.calib_max_seq_length", "is not an integer >= 1"),
    (_check, dict(max_batch_size=0), PortError, "CheckOptions.max_batch_size", "is not an integer >= 1"),
    (_check, dict(gpu_memory_gb=-1.0), PortError, "CheckOptions.gpu_memory_gb", "is not a number >= 0"),
    (_check, dict(gpu_memory_gb=math.nan), PortError, "CheckOptions.gpu_memory_gb", "nan (float) is not a number"),
    (_tune, dict(max_nodes=0), PortError, "TuneOptions.max_nodes", "is not an integer in 1..4096"),
    (_tune, dict(new_tokens=1 << 17), PortError, "TuneOptions.new_tokens", "is not an integer in 1..65536"),
    (_train, dict(fit=dict(num_heads=0)), PortError, "TrainOptions.fit.num_heads", "is not an integer in 1..64"),
    (_train, dict(fit=dict(heldout_fraction=1.0)), PortError, "TrainOptions.fit.heldout_fraction", "below 1"),
    # strings outside their choice set, a non-bool for a bool
    (_convert, dict(dtype="fp16"), ConversionError, "ConvertOptions.dtype", "'fp16' (str) is not one of 'auto'"),
    (_check, dict(qformat="fp4"), PortError, "CheckOptions.qformat", "is not one of 'fp8'"),
    (_verify, dict(gemm_plugin="int8"), PortError, "VerifyOptions.gemm_plugin", "is not one of 'auto', 'fp8'"),
    (_tune, dict(estimate="sum"), PortError, "TuneOptions.estimate", "is not one of 'product', 'joint'"),
    (_convert, dict(overwrite="yes"), ConversionError, "ConvertOptions.overwrite", "(str) is not a bool"),
    # calibration: the Calibration type or None
    (_convert, dict(calibration={"inputs": {}}), ConversionError, "ConvertOptions.calibration",
     "(dict) is not a quant.calibrate.Calibration"),
    # prompts: a PromptInputs (and its fields of their types)
    (_check, dict(prompts=["Hello"]), PortError, "CheckOptions.prompts", "['Hello'] (list) is not a PromptInputs"),
    (_verify, dict(prompts=[[1, 2, 3]]), PortError, "VerifyOptions.prompts", "(list) is not a PromptInputs"),
    (_tune, dict(prompts="Hello"), PortError, "TuneOptions.prompts", "(str) is not a PromptInputs"),
    (_train, dict(prompts=["Hello"]), PortError, "TrainOptions.prompts", "(list) is not a PromptInputs"),
    (_verify, dict(prompts=api.PromptInputs(prompt_ids=[[1, "2"]])), PortError, "VerifyOptions.prompts.prompt_ids",
     "is not a list of token-id lists"),
    (_check, dict(prompts=api.PromptInputs(prompt="Hello")), PortError, "CheckOptions.prompts.prompt",
     "'Hello' (str) is not a list of strings"),
    # trees: a str or a list
    (_tree, dict(choices=None), TreeError, "TreeOptions.choices", "None (NoneType) is not a medusa_choices tree"),
    (_convert, dict(medusa_choices=5), ConversionError, "ConvertOptions.medusa_choices", "5 (int) is not a "
     "medusa_choices tree"),
    (_verify, dict(medusa_choices=("0",)), PortError, "VerifyOptions.medusa_choices", "is not a medusa_choices tree"),
    # build's own flags
    (_build, dict(args="--output_dir e"), CheckpointError, "BuildOptions.args", "(str) is not a list of strings"),
]


@pytest.mark.parametrize("call, kw, error, where, words", BAD,
                         ids=[f"{w}={kw[next(iter(kw))]!r}" for _, kw, _, w, _ in BAD])
def test_bad_options_are_refused_at_the_boundary_naming_the_field(call, kw, error, where, words):
    with pytest.raises(PortError) as e:
        call(**kw)
    err = e.value
    assert type(err) is error, (type(err), err)
    assert err.where == where, err
    assert words in err.what, err.what
    assert err.fix and where in err.fix  # the fix names the field and what it takes
    assert err.to_dict()["where"] == where


def test_nothing_is_written_and_nothing_read_before_the_refusal(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match="ConvertOptions.tp_size"):  # not config.json's "tp_size": true
        _convert(model_dir=tmp_path / "missing-base", output_dir=out, tp_size=True)
    assert not out.exists()


def test_options_of_another_class_are_refused():
    with pytest.raises(ConversionError) as e:
        api.convert(api.CheckOptions(model_dir=M))
    assert e.value.where == "ConvertOptions" and "is not a ConvertOptions" in e.value.what
    with pytest.raises(PortError) as e:
        api.verify({"model_dir": "m", "checkpoint_dir": "c"})
    assert e.value.where == "VerifyOptions"


def test_inspect_heads_validates_its_arguments():
    with pytest.raises(HeadsError) as e:
        api.inspect_heads(None)
    assert e.value.where == "inspect_heads.path" and "is not a path" in e.value.what
    with pytest.raises(HeadsError) as e:
        api.inspect_heads("h", data_check="no")
    assert e.value.where == "inspect_heads.data_check"


def test_build_raises_for_a_missing_or_refused_checkpoint(tmp_path):
    with pytest.raises(CheckpointError) as e:
        api.build(api.BuildOptions(checkpoint_dir=tmp_path / "missing"))
    assert e.value.where == str(tmp_path / "missing") and e.value.what == "no such directory" and e.value.fix
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        api.build(api.BuildOptions(checkpoint_dir=tmp_path / "file"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(CheckpointError) as e:  # a Hugging Face config, not a TensorRT-LLM checkpoint's
        api.build(api.BuildOptions(checkpoint_dir=tmp_path / "hf"))
    assert "architecture" in e.value.what and e.value.where.endswith("config.json")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("nope")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        api.build(api.BuildOptions(checkpoint_dir=tmp_path / "bad"))
    # the command still exits 1 with the error on stderr
    assert main(["build", "--checkpoint_dir", str(tmp_path / "missing")]) == 1


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


OPTION_CLASSES = ["ConvertOptions", "AddHeadsOptions", "CheckOptions", "VerifyOptions", "TrainOptions", "FitOptions",
                  "TuneOptions", "TreeOptions", "BuildOptions", "PromptInputs"]


@pytest.mark.parametrize("name", OPTION_CLASSES)
def test_every_field_of_every_option_class_has_a_spec(name):
    missing = set(_fields(getattr(api, name))) - set(api._SPECS[name])
    assert not missing, f"{name}: fields with no validation spec: {sorted(missing)}"


GOOD = {
    "ConvertOptions": dict(model_dir="m", medusa_model_dir=Path("h"), tp_size=2, calib_size=8, threads=1,
                           medusa_choices=[[0], [1]], qformat="fp8", calibration=None),
    "AddHeadsOptions": dict(base_checkpoint_dir="c", medusa_model_dir="h", dtype="auto"),
    "CheckOptions": dict(model_dir="m", gpu_memory_gb=24, max_batch_size=4, prompts=api.PromptInputs(prompt=["hi"])),
    "VerifyOptions": dict(model_dir="m", checkpoint_dir="c", prompts=api.PromptInputs(prompt_ids=[[1, 2]]),
                          max_quant_error=0.5, calib_size=None),
    "TrainOptions": dict(model_dir="m", output_dir="o"),
    "FitOptions": dict(batch_size=None, heldout_fraction=0.0),
    "TuneOptions": dict(model_dir="m", medusa_model_dir="h", baseline=None),
    "TreeOptions": dict(choices="mc_sim_7b_63"),
    "BuildOptions": dict(checkpoint_dir="c", args=["--output_dir", "e"]),
    "PromptInputs": dict(),
}


@pytest.mark.parametrize("name", OPTION_CLASSES)
def test_good_options_pass_validation(name):
    api._validate(getattr(api, name)(**GOOD[name]))  # the defaults and the values above raise nothing


def test_good_options_run():
    res = api.tree(api.TreeOptions(choices=[[0], [1], [0, 0]], num_heads=2, top_k=4))
    assert res.to_dict()["num_nodes"] == 3
    assert api.tree(api.TreeOptions("mc_sim_7b_63", num_heads=2)).notes


def test_inspect_heads_json_has_one_type_per_key(tmp_path, capsys):
    shared = save_heads(random_heads(16, 32, num_heads=2, own_lm_head=False), tmp_path / "v2", "fasterdecoding-v2")
    own = save_heads(random_heads(16, 32, num_heads=2), tmp_path / "own")
    d = api.inspect_heads(shared).to_dict()
    assert d["shares_base_lm_head"] is True
    assert d["vocab_size"] is None and d["vocab_size_note"] == "the base's (the heads use its lm_head)"
    d = api.inspect_heads(own).to_dict()
    assert d["vocab_size"] == 32 and d["vocab_size_note"] is None
    assert main(["inspect-heads", str(shared), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["vocab_size"] is None and isinstance(printed["vocab_size_note"], str)
    assert main(["inspect-heads", str(shared)]) == 0  # the text output says it in words
    text = capsys.readouterr().out
    assert "vocab_size" in text and "the base's (the heads use its lm_head)" in text and "vocab_size_note" not in text


def test_the_api_accepts_what_each_flag_accepts():
    """Issue 65, 5: every options field with a ranged flag has the range its flag's type declares (cli_flags/types.py
    ``accepts``), and the same choices: the API refused nothing the CLI took, but accepted --max_memory 0 and a
    negative --lr that the CLI refused."""
    from trtllm_medusa_ports.cli import build_parser
    from trtllm_medusa_ports.options.validation import SPECS

    commands = {"ConvertOptions": "convert", "CheckOptions": "check", "VerifyOptions": "verify",
                "TrainOptions": "train-heads", "FitOptions": "train-heads", "TuneOptions": "tune-tree",
                "TreeOptions": "tree", "DeployOptions": "deploy", "AddHeadsOptions": "convert"}
    #: where the flag spells a value the API spells otherwise: --batch_size 0 is FitOptions.batch_size None
    mapped = {("FitOptions", "batch_size"): ("int", 0, None, False, False)}
    compared = 0
    for owner, command in commands.items():
        parser = build_parser(command)._subparsers._group_actions[0].choices[command]
        actions = {o: a for a in parser._actions for o in a.option_strings}
        for field, spec in SPECS[owner].items():
            action = actions.get(spec.flag or f"--{field}") if spec.flag is not None else None
            if action is None:
                continue
            accepts = getattr(action.type, "accepts", None)
            if accepts is not None:
                kind, lo, hi, lo_excluded, hi_excluded = accepts
                api_side = (spec.kind, spec.lo, spec.below if spec.below is not None else spec.hi, spec.lo_excluded,
                            spec.below is not None)
                if (owner, field) in mapped:
                    assert accepts == mapped[(owner, field)] and spec.lo == 1 and spec.none, (owner, field)
                else:
                    assert api_side == (kind, lo, hi, lo_excluded, hi_excluded), (owner, field, api_side, accepts)
                compared += 1
            elif action.choices is not None and spec.choices is not None:
                assert tuple(action.choices) == tuple(spec.choices), (owner, field)
                compared += 1
    assert compared >= 25, compared
