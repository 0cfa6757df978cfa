"""No global side effects from an API call (issue 65, 6): each API function, called as a library user calls it,
leaves the process as it found it - transformers' classes unpatched (calibration records the KV cache through its
own cache instance, not a patch of Cache.update), its progress bars and verbosity, the environment, torch's threads,
default dtype and grad mode, the logging configuration, the working directory, signal handlers, warnings filters.
CI runs this on transformers 5.x and on TensorRT-LLM 1.2's pins (transformers 4.57)."""

import json
import logging
import os
import signal
import sys
import warnings

import torch
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
)

ARCH = "LlamaForCausalLM"


def _state() -> dict:
    from transformers import cache_utils
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    package = logging.getLogger("trtllm_medusa_ports")
    return {
        "Cache.update": cache_utils.Cache.update, "DynamicCache.update": cache_utils.DynamicCache.update,
        "hf progress bars": hf_logging.is_progress_bar_enabled(), "hf verbosity": hf_logging.get_verbosity(),
        "environ": dict(os.environ), "cwd": os.getcwd(),
        "torch threads": torch.get_num_threads(), "torch dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(), "root handlers": list(root.handlers), "root level": root.level,
        "package handlers": list(package.handlers), "package level": package.level,
        "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)},
        "warnings filters": list(warnings.filters), "stdout": sys.stdout, "stderr": sys.stderr,
    }


def _changed(before: dict) -> dict:
    after = _state()
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def test_every_api_function_leaves_the_process_as_it_found_it(store, tmp_path):
    base = tiny_base(store, ARCH, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32)
    c = tiny_config(ARCH)
    save_tiny_tokenizer(tmp_path / "tok", c.vocab_size)
    heads = save_heads(random_heads(128, c.vocab_size, num_heads=2, seed=5), tmp_path / "heads")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"input_ids": [(7 * i + j) % c.vocab_size for i in range(12)]}) + "\n"
                             for j in range(3)))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt_ids": [(5 * i + j) % c.vocab_size for i in range(6)]}) + "\n"
                            for j in range(4)))
    ckpt = tmp_path / "ckpt"
    calls = {
        "tree": lambda: api.tree(api.TreeOptions("mc_sim_7b_63", num_heads=2)),
        "inspect_heads": lambda: api.inspect_heads(heads),
        "check": lambda: api.check(api.CheckOptions(model_dir=base, medusa_model_dir=heads, quiet=True,
                                                    prompts=api.PromptInputs(prompt_ids=[[1, 2, 3]]))),
        "convert (FP8 and an FP8 KV cache: calibration)": lambda: api.convert(api.ConvertOptions(
            model_dir=base, medusa_model_dir=heads, output_dir=ckpt, qformat="fp8", kv_cache_dtype="fp8",
            calib_dataset=calib, calib_size=3, quiet=True, medusa_choices="[[0],[1],[0,0]]")),
        "verify": lambda: api.verify(api.VerifyOptions(model_dir=base, checkpoint_dir=ckpt, max_new_tokens=3,
                                                       quiet=True, calib_dataset=calib, calib_size=3)),
        "train_heads": lambda: api.train_heads(api.TrainOptions(
            model_dir=base, output_dir=tmp_path / "trained", prompts=api.PromptInputs(data=data), new_tokens=4,
            fit=api.FitOptions(num_heads=2, steps=2, quiet=True, distill=0.0, matmul_dtype="float32"))),
        "tune_tree": lambda: api.tune_tree(api.TuneOptions(model_dir=base, medusa_model_dir=heads, quiet=True,
                                                           prompts=api.PromptInputs(data=data), new_tokens=4)),
        "deploy": lambda: api.deploy(api.DeployOptions(ckpt, tmp_path / "tok", tmp_path / "serve")),
    }
    from trtllm_medusa_ports.errors import PortError

    refused = []
    for name, call in calls.items():
        before = _state()
        try:
            call()
        except PortError:  # a refusal leaves the process as it found it too (tune-tree on random heads: no tree)
            refused.append(name)
        assert not _changed(before), (name, _changed(before))
    assert refused == ["tune_tree"], refused  # every other call ran through


def test_calibration_records_the_kv_cache_through_its_own_cache_instance(store, tmp_path):
    """The KV amax calibration records equals what a class-level patch of Cache.update recorded, and the class is
    never patched, not even while the model runs."""
    from transformers import cache_utils

    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.quant import calibrate as cal_mod

    base = tiny_base(store, ARCH)
    vocab = tiny_config(ARCH).vocab_size
    samples = [[(3 * i + j) % vocab for i in range(10)] for j in range(2)]
    seen = []
    original = cache_utils.Cache.update

    def spy(self, key_states, value_states, layer_idx, *a, **k):  # a reference record, the old way
        seen.append((int(layer_idx), max(float(key_states.abs().max()), float(value_states.abs().max()))))
        return original(self, key_states, value_states, layer_idx, *a, **k)

    cache_utils.Cache.update = spy
    try:
        cal = cal_mod.calibrate(base, adapter_for(ARCH), "float32", samples, quiet=True)
    finally:
        cache_utils.Cache.update = original
    want: dict[int, float] = {}
    for layer, amax in seen:
        want[layer] = max(want.get(layer, 0.0), amax)
    assert want and cal.kv_cached == want  # every layer, the same values
