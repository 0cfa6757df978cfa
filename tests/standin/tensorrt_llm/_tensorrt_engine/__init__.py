"""tensorrt_llm/_tensorrt_engine/__init__.py ``LLM`` (= ``llmapi.llm._TrtLLM``, ``TrtLlmArgs``): the LLM API on a
built engine.

* the arguments are ``TrtLlmArgs`` fields: an unknown keyword is refused;
* ``validate_speculative_config`` (llmapi/llm_args.py) with the backend ``tensorrt``;
* ``_load_config_from_engine``: the engine directory's ``config.json`` through ``EngineConfig.from_json_file``,
  whose ``pretrained_config`` goes through ``PretrainedConfig.from_dict`` - ``MODEL_MAP[architecture]``, a KeyError
  for an unknown name (tensorrt_llm/builder.py, tensorrt_llm/models/modeling_utils.py);
* ``generate(prompts, sampling_params)``: one output per prompt (the stand-in records the call and returns the
  prompt's text: nothing is computed).
"""

import json
import os
from types import SimpleNamespace

from .. import CALLS
from ..llmapi.llm_args import validate_speculative_config
from ..models.modeling_utils import PretrainedConfig

_FIELDS = ("model", "tokenizer", "speculative_config", "kv_cache_config", "tensor_parallel_size",
           "pipeline_parallel_size", "max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width")


class LLM:
    def __init__(self, model, **kwargs):
        extra = sorted(set(kwargs) - set(_FIELDS))
        if extra:
            raise ValueError(f"TrtLlmArgs: Extra inputs are not permitted: {extra}")
        validate_speculative_config(kwargs.get("speculative_config"), "tensorrt")
        with open(os.path.join(model, "config.json")) as f:
            engine = json.load(f)
        self.pretrained_config = PretrainedConfig.from_dict(engine["pretrained_config"])
        self.build_config = engine["build_config"]
        self.args = {"model": model, **kwargs}
        CALLS.append(("llm", self.args))

    def generate(self, prompts, sampling_params=None):
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        CALLS.append(("generate", prompts, sampling_params))
        return [SimpleNamespace(outputs=[SimpleNamespace(text=p)]) for p in prompts]
