"""The commands a checkpoint is built and run with (trtllm_medusa_ports/deploy): which build command, the Medusa
mode flag, the XQA JIT switch, and that convert and verify end by naming the build command."""

import json
import shlex

import pytest
from conftest import tiny_base
from test_quant import _heads

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.deploy.commands import (
    build_argv,
    build_line,
    build_tool,
    needs_xqa_jit,
    world_size,
)
from trtllm_medusa_ports.verify import verify


def _cfg(arch="MedusaPortsGPTNeoXForCausalLM", heads=8, kv=8, hidden=1024, **kw):
    return {"architecture": arch, "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_size": hidden,
            "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}, **kw}


def test_our_classes_build_with_trtllm_medusa_build_and_upstreams_with_trtllm_build():
    """trtllm-build looks architecture up in MODEL_MAP (tensorrt_llm/commands/build.py): our MedusaPorts names are not
    there; the 1.x builder turns Medusa on only with --speculative_decoding_mode medusa (tensorrt_llm/builder.py)."""
    ours = build_argv(_cfg(), "/ck", "/eng", max_batch_size=8, max_seq_len=4096, max_input_len=None)
    assert ours == ["trtllm-medusa", "build", "--checkpoint_dir", "/ck", "--output_dir", "/eng",
                    "--speculative_decoding_mode", "medusa", "--max_batch_size", "8", "--max_seq_len", "4096"]
    assert build_tool(_cfg(arch="MedusaForCausalLM")) == "trtllm-build"
    assert build_argv(_cfg(arch="MedusaForCausalLM"), "c", "e")[:1] == ["trtllm-build"]
    assert world_size(_cfg()) == 2 and world_size({"mapping": {"tp_size": 2, "pp_size": 3}}) == 6


@pytest.mark.parametrize("heads, kv, hidden, needed", [
    (8, 8, 1024, False),   # head size 128, group 1: the runner's JIT kernels (group divides 64)
    (12, 4, 768, True),    # head size 64, group 3: precompiled picked (3 does not divide 64), none for 64: JIT only
    (24, 8, 3072, False),  # head size 128, group 3: the precompiled head-size-128 kernels serve it
])
def test_the_xqa_jit_switch_is_set_where_only_the_jit_kernels_serve(heads, kv, hidden, needed):
    cfg = _cfg(heads=heads, kv=kv, hidden=hidden)
    assert needs_xqa_jit(cfg) is needed
    line = build_line(cfg, "/c d")
    assert line.startswith("TRTLLM_ENABLE_XQA_JIT=1 ") is needed
    assert shlex.split(line)[int(needed):] == ["trtllm-medusa", "build", "--checkpoint_dir", "/c d", "--output_dir",
                                               "ENGINE_DIR", "--speculative_decoding_mode", "medusa"]
    assert "'/c d'" in line  # quoted for the shell


def test_convert_and_verify_end_by_naming_the_build_command(tmp_path, store, capsys):
    base = tiny_base(store, "GPTNeoXForCausalLM")
    ckpt = tmp_path / "ck"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir",
                 str(_heads(tmp_path, "GPTNeoXForCausalLM", 64)), "--output_dir", str(ckpt), "--dtype", "float16",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    cfg = json.loads((ckpt / "config.json").read_text())
    line = build_line(cfg, ckpt)
    assert out.rstrip().endswith(f"Build it with: {line}") and "trtllm-medusa build" in line
    assert "--speculative_decoding_mode medusa" in line
    rep = verify(base, ckpt, max_new_tokens=2)
    assert rep.build_command == line and f"build with        : {line}" in rep.render()
    assert rep.to_dict()["build_command"] == line
