"""tensorrt_llm/commands/serve.py ``serve`` (trtllm-serve's default command): its options as argparse (upstream uses
click: the same names, defaults and choices), and the LLM arguments it builds.

* ``MODEL`` positional; ``--backend`` {pytorch, tensorrt, _autodeploy} (alias ``trt``), default **pytorch**;
  ``--tokenizer``, ``--host`` localhost, ``--port`` 8000, ``--max_batch_size``, ``--max_num_tokens``,
  ``--max_seq_len``, ``--tp_size`` 1, ``--pp_size`` 1, ``--kv_cache_free_gpu_memory_fraction`` 0.9,
  ``--extra_llm_api_options``;
* ``get_llm_args``: the command line's values, ``kv_cache_config`` built from the memory fraction; then
  ``update_llm_args_with_extra_dict`` with the YAML (``yaml.safe_load``), whose top-level keys replace those;
* ``launch``: only ``--backend tensorrt`` builds the TensorRT-engine LLM (tensorrt_llm/_tensorrt_engine); any other
  backend builds the PyTorch LLM, whose speculative-config check refuses Medusa (``supports_backend``), which is all
  the stand-in models of it.
"""

import argparse

from ..llmapi.llm_args import KvCacheConfig, update_llm_args_with_extra_dict


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtllm-serve")
    p.add_argument("model")
    p.add_argument("--backend", choices=["pytorch", "tensorrt", "trt", "_autodeploy"], default="pytorch")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max_batch_size", type=int, default=2048)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--tp_size", "--tensor_parallel_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction", type=float, default=0.9)
    p.add_argument("--extra_llm_api_options", "--config", default=None)
    return p


def get_llm_args(args: argparse.Namespace) -> dict:
    import yaml

    llm_args = {"model": args.model, "tokenizer": args.tokenizer, "backend": "tensorrt" if args.backend == "trt"
                else args.backend, "tensor_parallel_size": args.tp_size, "pipeline_parallel_size": args.pp_size,
                "max_batch_size": args.max_batch_size, "max_num_tokens": args.max_num_tokens,
                "max_seq_len": args.max_seq_len,
                "kv_cache_config": KvCacheConfig(free_gpu_memory_fraction=args.kv_cache_free_gpu_memory_fraction)}
    if args.extra_llm_api_options:
        with open(args.extra_llm_api_options) as f:
            llm_args = update_llm_args_with_extra_dict(llm_args, yaml.safe_load(f))
    return llm_args


def launch(args: argparse.Namespace):
    """The LLM ``serve`` would start for these options (see the module doc)."""
    from .._tensorrt_engine import LLM
    from ..llmapi.llm_args import validate_speculative_config

    llm_args = get_llm_args(args)
    backend = llm_args.pop("backend")
    if backend != "tensorrt":
        validate_speculative_config(llm_args.get("speculative_config"), backend)
        raise NotImplementedError(f"the stand-in models the TensorRT engine flow only, not backend {backend}")
    return LLM(**llm_args)
