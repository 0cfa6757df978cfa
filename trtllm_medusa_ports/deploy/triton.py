"""What Triton's TensorRT-LLM backend reads: the values each model's ``config.pbtxt`` template is filled with.

- ``medusa_choices``: brace groups of comma-separated ints, ``{0}, {0, 0}, {1}``: the C++ backend reads the parameter
  with ``utils::csvStrToVecVecInt`` (triton_backend/inflight_batcher_llm/src/utils.cc: up to each ``}``, one leading
  ``{`` dropped, ``std::stoi`` per comma field) and, on any failure (square brackets, a leading space, an unfilled
  ``${medusa_choices}``), logs one line and serves mc_sim_7b_63. ``decoding_mode`` must be ``medusa`` for it to be
  read at all (src/model_instance_state.cc).
- ``tools/fill_template.py``: its argument is split on ``,`` and then each piece on ``:``, a backslash escaping the
  next character in each split; so a value's ``:`` and ``,`` are escaped for both splits (:func:`fill_argument`), and
  every key must occur in the template.

String values are escaped for pbtxt (``deploy.quoting.pbtxt``): ``fill_template.py`` puts them between a
``string_value``'s double quotes as they are.

May import: ``deploy.quoting``.
"""

from __future__ import annotations

from trtllm_medusa_ports.deploy.quoting import pbtxt


def medusa_choices_braces(paths: list[list[int]]) -> str:
    return ", ".join("{" + ", ".join(str(i) for i in p) + "}" for p in paths)


def _escape(text: str, delimiter: str) -> str:
    return text.replace("\\", "\\\\").replace(delimiter, "\\" + delimiter)


def fill_argument(values: dict[str, object]) -> str:
    """``fill_template.py``'s substitution argument for ``values`` (see the module doc)."""
    return ",".join(_escape(f"{k}:{_escape(str(v), ':')}", ",") for k, v in values.items())


def triton_fill(paths: list[list[int]], engine_dir: str, tokenizer_dir: str, max_batch_size: int,
                kv_fraction: float) -> dict:
    """Per model of the inflight-batcher repository, the values its template takes (the template keys, from
    triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt), and the fill argument for them."""
    values = {
        "tensorrt_llm": {"triton_backend": "tensorrtllm", "triton_max_batch_size": max_batch_size,
                         "decoupled_mode": "false", "engine_dir": pbtxt(engine_dir), "max_queue_delay_microseconds": 0,
                         "batching_strategy": "inflight_fused_batching", "encoder_input_features_data_type": "TYPE_FP16",
                         # a bare data_type enum in the template: unfilled, config.pbtxt does not parse and Triton
                         # loads neither tensorrt_llm nor ensemble (p-tuning's table: unused here; upstream's fill
                         # lines pass TYPE_FP16)
                         "prompt_embedding_table_data_type": "TYPE_FP16",
                         "logits_datatype": "TYPE_FP32", "max_beam_width": 1, "kv_cache_free_gpu_mem_fraction": kv_fraction,
                         "exclude_input_in_output": "true", "decoding_mode": "medusa",
                         "medusa_choices": medusa_choices_braces(paths)},
        "preprocessing": {"tokenizer_dir": pbtxt(tokenizer_dir), "triton_max_batch_size": max_batch_size,
                          "preprocessing_instance_count": 1},
        "postprocessing": {"tokenizer_dir": pbtxt(tokenizer_dir), "triton_max_batch_size": max_batch_size,
                           "postprocessing_instance_count": 1},
        "ensemble": {"triton_max_batch_size": max_batch_size, "logits_datatype": "TYPE_FP32"},
    }
    return {"values": values, "fill": {m: fill_argument(v) for m, v in values.items()}}
