"""One typed reader of a checkpoint's config.json (issue 63, 2): a field of the wrong type is one error naming
config.json and the field, for every command that reads a checkpoint, never a traceback where it is first used."""

import json
import shutil

import pytest
from test_deploy import served  # noqa: F401  (the fixture)

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.files.checkpoint import read_checkpoint

CASES = [
    ("num_medusa_heads", "3", "a non-negative integer"),
    ("num_medusa_heads", [3], "a non-negative integer"),
    ("max_draft_len", 63.5, "a non-negative integer"),
    ("max_position_embeddings", "x", "a positive integer"),
    ("head_size", "x", "a positive integer"),
    ("num_medusa_layers", "1", "a positive integer"),
    ("rotary_base", "x", "a finite number"),
    ("norm_epsilon", True, "a finite number"),
    ("position_embedding_type", 3, "one of TensorRT-LLM's PositionEmbeddingType names"),
    # names as upstream's enums parse them (issue 75): a string the engine does not know is refused here too
    ("position_embedding_type", "rope", "one of TensorRT-LLM's PositionEmbeddingType names"),
    ("position_embedding_type", "ROPE_GPT_NEOX", "one of TensorRT-LLM's PositionEmbeddingType names"),
    ("rotary_scaling", {"type": "su", "short_factor": [1.0]}, "an object whose type (or rope_type) is one of"),
    ("rotary_scaling", {"rope_type": "default"}, "an object whose type (or rope_type) is one of"),
    ("rotary_scaling", {"type": "Linear", "factor": 2.0}, "an object whose type (or rope_type) is one of"),
    ("rotary_scaling", {"factor": 2.0}, "an object whose type (or rope_type) is one of"),
    ("rotary_scaling", "linear", "an object whose type (or rope_type) is one of"),
    ("architecture", 3, "a string"),
    ("hidden_act", "SiLU", "one of TensorRT-LLM's ACT2FN names"),
    ("logits_dtype", "fp32", "one of float32, float16, bfloat16"),
    ("hidden_act", "gelu_exact", "one of TensorRT-LLM's ACT2FN names"),
    ("medusa_hidden_act", "swish", "one of TensorRT-LLM's ACT2FN names"),
    ("medusa_shared_lm_head", "false", "true or false"),
    ("quantization", "FP8", "a JSON object"),
    ("quantization.quant_algo", 3, "one of TensorRT-LLM's QuantAlgo names for weights"),
    ("quantization.quant_algo", "fp8", "one of TensorRT-LLM's QuantAlgo names for weights"),
    ("quantization.quant_algo", "INT8", "one of TensorRT-LLM's QuantAlgo names for weights"),  # KV cache only
    ("quantization.kv_cache_quant_algo", "W8A16", "one of FP8, INT8, NVFP4"),
    ("quantization.kv_cache_quant_algo", "fp8", "one of FP8, INT8, NVFP4"),
    ("moe.normalization_mode", "1", "an integer of tensorrt_llm/layers/moe.py ExpertScaleNormalizationMode"),
    ("moe.normalization_mode", 7, "an integer of tensorrt_llm/layers/moe.py ExpertScaleNormalizationMode"),
    ("moe.normalization_mode", True, "an integer of tensorrt_llm/layers/moe.py ExpertScaleNormalizationMode"),
    ("moe.top_k", "2", "a non-negative integer"),
    ("quantization.exclude_modules", "lm_head", "a list of module patterns"),
    ("medusa_ports", "x", "a JSON object"),
    ("medusa_ports", [1], "a JSON object"),
    ("medusa_ports.medusa_choices", {"a": 1}, "a non-empty list of paths"),
    ("medusa_ports.medusa_choices", "[[0]]", "a non-empty list of paths"),
    ("medusa_ports.medusa_choices", [[0], [-1]], "a non-empty list of paths"),
    ("medusa_ports.medusa_choices_from", 3, "a string"),
]


def _junk(served, tmp_path, field, value):  # noqa: F811
    ckpt = shutil.copytree(served[0], tmp_path / "junk")
    cfg = json.loads((ckpt / "config.json").read_text())
    *parents, key = field.split(".")
    holder = cfg
    for p in parents:
        holder = holder.setdefault(p, {})
    holder[key] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


@pytest.mark.parametrize("field, value, expected", CASES)
def test_a_field_of_the_wrong_type_is_named_by_every_reader(served, tmp_path, capsys, field, value,  # noqa: F811
                                                            expected):
    ckpt = _junk(served, tmp_path, field, value)
    with pytest.raises(CheckpointError) as e:  # verify, add-heads and build read it through read_checkpoint
        read_checkpoint(ckpt)
    assert f"{field} is {json.dumps(value)}, not {expected}" in str(e.value)
    assert str(ckpt / "config.json") in str(e.value)
    out = tmp_path / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(served[1]),
                 "--output_dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{field} is {json.dumps(value)}, not {expected}" in err and "Traceback" not in err
    assert not out.exists()


def test_null_fields_are_left_to_the_readers_defaults(served, tmp_path):  # noqa: F811
    ckpt = _junk(served, tmp_path, "rotary_base", None)
    assert read_checkpoint(ckpt).config["rotary_base"] is None
