"""TensorRT-LLM 1.2's ``examples/run.py`` command line as it reads it: ``parse_arguments`` with
``examples/utils.py`` ``add_common_args`` (the flags a Medusa run uses, with upstream's defaults), and what ``main``
then checks for Medusa: ``--medusa_choices`` through ``ast.literal_eval``, ``--temperature 1.0`` and one beam asserted.
Outside the stand-in package: nothing here is importable as ``tensorrt_llm``.
"""

import argparse
import ast


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py")
    p.add_argument("--max_output_len", type=int, required=True)
    p.add_argument("--max_input_length", type=int, default=923)
    p.add_argument("--input_text", type=str, nargs="+", default=["Born in north-east France, Soyer trained as a"])
    p.add_argument("--input_file", type=str, default=None)
    p.add_argument("--engine_dir", type=str, default="engine_outputs")
    p.add_argument("--tokenizer_dir", type=str, default=None)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=1)
    p.add_argument("--top_p", type=float, default=0.0)
    p.add_argument("--num_beams", type=int, default=1)
    p.add_argument("--medusa_choices", type=str, default=None)
    p.add_argument("--use_py_session", action="store_true")
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
    p.add_argument("--streaming", action="store_true")
    return p


def medusa_run(argv: list[str]):
    """The parsed flags and the tree, as run.py's main takes them for a Medusa engine (its assertions included)."""
    args = parser().parse_args(argv)
    choices = ast.literal_eval(args.medusa_choices)
    assert args.temperature == 1.0, "Medusa should use temperature == 1.0"
    assert args.num_beams == 1, "Medusa should use num_beams == 1"
    return args, choices
