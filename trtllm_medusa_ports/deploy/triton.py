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

import re

from trtllm_medusa_ports.deploy.quoting import pbtxt


def medusa_choices_braces(paths: list[list[int]]) -> str:
    return ", ".join("{" + ", ".join(str(i) for i in p) + "}" for p in paths)


def _escape(text: str, delimiter: str) -> str:
    return text.replace("\\", "\\\\").replace(delimiter, "\\" + delimiter)


def fill_argument(values: dict[str, object]) -> str:
    """``fill_template.py``'s substitution argument for ``values`` (see the module doc)."""
    return ",".join(_escape(f"{k}:{_escape(str(v), ':')}", ",") for k, v in values.items())


def bundle_name(path: str) -> str:
    """A bundle-relative directory (``./engine``) as its plain name, which fill.sh appends to the bundle's path."""
    name = path.removeprefix("./")
    if not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"not a bundle directory name: {path!r}")
    return name


def triton_fill(paths: list[list[int]], engine_dir: str, tokenizer_dir: str, max_batch_size: int,
                kv_fraction: float) -> dict:
    """Per model of the inflight-batcher repository, the values its template takes (the template keys, from
    triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt), and the fill argument for them.

    A relative ``engine_dir`` or ``tokenizer_dir`` is the bundle's (``./engine``): Triton needs it absolute, so it
    is left out of ``fill`` and listed in ``in_bundle``; fill.sh appends ``,key:<the bundle's path>/<name>`` where it
    runs (:func:`fill_at`)."""
    in_bundle = {}
    for model, key, path in (("tensorrt_llm", "engine_dir", engine_dir), ("preprocessing", "tokenizer_dir",
                                                                         tokenizer_dir),
                             ("postprocessing", "tokenizer_dir", tokenizer_dir)):
        if not path.startswith("/"):
            in_bundle.setdefault(model, {})[key] = path
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
    fill = {m: fill_argument({k: x for k, x in v.items() if k not in in_bundle.get(m, {})}) for m, v in values.items()}
    return {"values": values, "fill": fill, "in_bundle": in_bundle}


def fill_at(triton: dict, bundle: str) -> dict[str, str]:
    """Each model's fill argument as fill.sh passes it with the bundle at ``bundle`` (a path fill.sh accepts: no
    backslash, double quote, comma, colon or control character, so nothing to escape)."""
    return {m: fill + "".join(f",{k}:{bundle}/{bundle_name(v)}" for k, v in triton["in_bundle"].get(m, {}).items())
            for m, fill in triton["fill"].items()}
