#!/usr/bin/env python3
"""What simulating tensor parallelism rank by rank costs the reference executor on the suite's tiny bases.

The same base (a family's ``tiny_config``, the shape every family-wide test converts) is converted at tp 1 and 2 (the suite's; --tp 4 where the family's heads divide)
and decoded greedily token by token (``reference.decoding.plain_decode``), one torch thread; the result is the time
per generated token at each tp and its ratio to tp 1. The ratio bounds what computing every rank of a layer in one
batched operation could save: at most the difference to tp 1, since the batched layer still does tp 1's
operations on tensors as large as tp 1's.

Run: python benchmarks/executor_tp.py [--families LlamaForCausalLM MixtralForCausalLM] [--tokens 40] [--repeat 5]
     [--out benchmarks/results/executor_tp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["LlamaForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM"])
    ap.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch
    import transformers

    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.archs.registry import family_test_cases
    from trtllm_medusa_ports.files.hf_model import HFConfig
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base
    from trtllm_medusa_ports.reference.decoding import plain_decode
    from trtllm_medusa_ports.reference.executor import ReferenceModel

    torch.set_num_threads(1)
    prompt = [3, 14, 15, 92, 65]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.families:
            base = save_tiny_base(arch, Path(tmp) / arch)
            hf = HFConfig.read(base)
            heads = Path(tmp) / f"{arch}-heads"
            save_heads(random_heads(adapter_for(arch).hidden_size(hf), hf.get("vocab_size"), num_heads=3, seed=1),
                       heads, "fasterdecoding-pt")
            per_tp = {}
            for tp in args.tp:
                out = Path(tmp) / f"{arch}-tp{tp}"
                api.convert(api.ConvertOptions(model_dir=str(base), medusa_model_dir=str(heads), output_dir=str(out),
                                               tp_size=tp, dtype="float32", quiet=True,
                                               allow_unsupported=arch in family_test_cases()["unsupported"]))
                ref = ReferenceModel(out)
                plain_decode(ref, prompt, 8)  # warm
                best = float("inf")
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    plain_decode(ref, prompt, args.tokens)
                    best = min(best, time.perf_counter() - t)
                per_tp[tp] = best / args.tokens * 1e3
            row = {"family": arch, "ms_per_token": per_tp,
                   "ratio_to_tp1": {tp: round(v / per_tp[args.tp[0]], 3) for tp, v in per_tp.items()}}
            rows.append(row)
            print(f"{arch}: " + ", ".join(f"tp {tp} {v:.3f} ms/token (x{row['ratio_to_tp1'][tp]})"
                                          for tp, v in per_tp.items()), file=sys.stderr)
    result = {"rows": rows, "tokens": args.tokens, "repeat": args.repeat, "statistic": "min",
              "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                          "transformers": transformers.__version__, "threads": 1}}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
