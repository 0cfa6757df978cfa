#!/usr/bin/env python3
"""Conversion time and peak memory, ours against an upstream-style baseline (tp 2, float16).

Builds once, cached in --workdir, a synthetic float16 Qwen2 base of about --size_gb GB (sharded
safetensors + index json) and 4 FasterDecoding Medusa heads (medusa_lm_head.safetensors). Each
converter runs in a fresh subprocess (peak RSS from os.wait4; anonymous RSS sampled from
/proc/self/status, i.e. without the file pages of mmapped inputs). ours:
trtllm_medusa_ports.convert.convert. baseline: upstream convert_checkpoint.py's way -
from_pretrained, heads loaded whole, each rank's dict in memory, safetensors save_file per rank.
Both must write the same tensors. Run: python benchmarks/convert.py [--size_gb 1.0] [--out F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

H, N_HEADS, N_KV, INTER, VOCAB, MEDUSA_HEADS, TP = 1536, 12, 2, 4096, 32000, 4, 2
SHARD_BYTES = 400 * 1024**2  # like save_pretrained(max_shard_size="400MB")
MB = 1e6


def base_tensors(n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    kv = N_KV * (H // N_HEADS)
    layer = {"input_layernorm.weight": (H,), "self_attn.q_proj.weight": (H, H),
             "self_attn.q_proj.bias": (H,), "self_attn.k_proj.weight": (kv, H),
             "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.weight": (kv, H),
             "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.weight": (H, H),
             "post_attention_layernorm.weight": (H,), "mlp.gate_proj.weight": (INTER, H),
             "mlp.up_proj.weight": (INTER, H), "mlp.down_proj.weight": (H, INTER)}
    out = [("model.embed_tokens.weight", (VOCAB, H))]
    out += [(f"model.layers.{i}.{k}", v) for i in range(n_layers) for k, v in layer.items()]
    return out + [("model.norm.weight", (H,)), ("lm_head.weight", (VOCAB, H))]


def nbytes(shape: tuple[int, ...]) -> int:
    return 2 * math.prod(shape)  # float16


def rand(name: str, shape: tuple[int, ...], g):
    import torch

    t = torch.randn(shape, generator=g)
    return (1 + 0.1 * t if name.endswith("norm.weight") else 0.02 * t).to(torch.float16)


def build_inputs(workdir: Path, size_gb: float, quiet: bool) -> tuple[Path, Path]:
    """The cached base and heads directories (built unless a previous run finished them)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import Qwen2Config

    per_layer = sum(nbytes(s) for _, s in base_tensors(1)[1:-2])
    n_layers = max(1, round((size_gb * 1e9 - nbytes((2, VOCAB, H))) / per_layer))
    base, heads = workdir / f"qwen2-{n_layers}L-fp16", workdir / f"medusa{MEDUSA_HEADS}-fp16"
    g = torch.Generator().manual_seed(0)
    if not (base / "DONE").exists():
        tmp = base.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        Qwen2Config(hidden_size=H, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
                    intermediate_size=INTER, vocab_size=VOCAB, num_hidden_layers=n_layers,
                    max_position_embeddings=4096, tie_word_embeddings=False, dtype="float16",
                    architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp)
        shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
        for name, shape in base_tensors(n_layers):
            if shards[-1] and sum(nbytes(s) for _, s in shards[-1]) + nbytes(shape) > SHARD_BYTES:
                shards.append([])
            shards[-1].append((name, shape))
        index: dict = {"metadata": {"total_size": 0}, "weight_map": {}}
        bar = tqdm(total=sum(len(s) for s in shards), desc="build base", disable=quiet,
                   file=sys.stderr)
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            sd = {}
            for name, shape in shard:
                sd[name] = rand(name, shape, g)
                index["weight_map"][name] = fname
                index["metadata"]["total_size"] += nbytes(shape)
                bar.update(1)
            save_file(sd, str(tmp / fname), metadata={"format": "pt"})
            del sd
        bar.close()
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (tmp / "DONE").write_text("")
        shutil.rmtree(base, ignore_errors=True)
        tmp.rename(base)
    if not (heads / "DONE").exists():
        heads.mkdir(parents=True, exist_ok=True)
        parts = {"0.linear.weight": (H, H), "0.linear.bias": (H,), "1.weight": (VOCAB, H)}
        sd = {f"{h}.{k}": rand(k, v, g) for h in range(MEDUSA_HEADS) for k, v in parts.items()}
        save_file(sd, str(heads / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
        (heads / "config.json").write_text(json.dumps({"medusa_num_heads": MEDUSA_HEADS,
                                                       "medusa_num_layers": 1}))
        (heads / "DONE").write_text("")
    return base, heads


def rank_weights(sd: dict, heads: dict, n_layers: int, rank: int) -> dict:
    """One rank's TensorRT-LLM tensors, built in memory from the whole model (upstream's way)."""
    from trtllm_medusa_ports.sharding import Split, shard

    w: dict = {}

    def put(name: str, rule: Split, t) -> None:
        w[name] = shard(rule, t, tp_size=TP, tp_rank=rank, num_kv_heads=N_KV).contiguous()

    put("transformer.vocab_embedding.weight", Split.EMBEDDING, sd["model.embed_tokens.weight"])
    for i in range(n_layers):
        p, q, a = f"model.layers.{i}.", f"transformer.layers.{i}.", f"model.layers.{i}.self_attn."
        put(q + "input_layernorm.weight", Split.REPLICATE, sd[p + "input_layernorm.weight"])
        for part in ("weight", "bias"):
            qkv = tuple(sd[f"{a}{x}_proj.{part}"] for x in "qkv")
            put(f"{q}attention.qkv.{part}", Split.QKV, qkv)
        put(q + "attention.dense.weight", Split.ROW, sd[a + "o_proj.weight"])
        put(q + "post_layernorm.weight", Split.REPLICATE, sd[p + "post_attention_layernorm.weight"])
        for dst, src, rule in (("fc", "gate_proj", Split.COLUMN), ("gate", "up_proj", Split.COLUMN),
                               ("proj", "down_proj", Split.ROW)):
            put(f"{q}mlp.{dst}.weight", rule, sd[f"{p}mlp.{src}.weight"])
    put("transformer.ln_f.weight", Split.REPLICATE, sd["model.norm.weight"])
    put("lm_head.weight", Split.VOCAB, sd["lm_head.weight"])
    for h in range(MEDUSA_HEADS):
        m = f"medusa_heads.{h}."
        put(m + "medusa_layers.0.linear.weight", Split.COLUMN, heads[f"{h}.0.linear.weight"])
        put(m + "medusa_layers.0.linear.bias", Split.COLUMN, heads[f"{h}.0.linear.bias"])
        put(m + "lm_head.weight", Split.VOCAB, heads[f"{h}.1.weight"])
    return w


def child(spec: dict) -> None:
    """Runs in the measured subprocess: one conversion, then its own timing to spec['result']."""
    start, peak_anon = time.time(), [0]

    def sample() -> None:
        while True:
            st = Path("/proc/self/status").read_text().split("RssAnon:")[1]
            peak_anon[0] = max(peak_anon[0], int(st.split()[0]))
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    if spec["kind"] == "ours":
        from trtllm_medusa_ports.convert import ConvertOptions, convert

        convert(ConvertOptions(model_dir=Path(spec["base"]), medusa_model_dir=Path(spec["heads"]),
                               output_dir=Path(spec["dst"]), dtype="float16", tp_size=TP,
                               quiet=True, workers=spec["workers"], overwrite=True))
    else:
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        if spec["quiet"]:
            logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(spec["base"], dtype=torch.float16)
        sd = model.state_dict()
        raw = load_file(str(Path(spec["heads"]) / "medusa_lm_head.safetensors"))
        heads = {k: v.to(torch.float16) for k, v in raw.items()}
        dst = Path(spec["dst"])
        dst.mkdir(parents=True)
        for rank in range(TP):
            w = rank_weights(sd, heads, model.config.num_hidden_layers, rank)
            save_file(w, str(dst / f"rank{rank}.safetensors"), metadata={"format": "pt"})
            del w
    res = {"seconds_inside": time.time() - start, "peak_anon_mb": peak_anon[0] * 1024 / MB}
    Path(spec["result"]).write_text(json.dumps(res))


def measure(spec: dict) -> dict:
    shutil.rmtree(spec["dst"], ignore_errors=True)
    start = time.time()
    proc = subprocess.Popen([sys.executable, __file__, "--_child", json.dumps(spec)],
                            stdout=sys.stderr)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    res = {"ok": rc == 0, "returncode": rc, "wall_s": time.time() - start,
           "peak_rss_mb": usage.ru_maxrss * 1024 / MB}
    if rc == 0:
        res.update(json.loads(Path(spec["result"]).read_text()))
        res["bytes_written"] = sum(f.stat().st_size for f in Path(spec["dst"]).iterdir())
    return res


def compare(a: Path, b: Path) -> dict:
    """Same names, shapes, dtypes on every rank (asserted); how many tensors are bit-identical."""
    import torch
    from safetensors import safe_open

    n = same = 0
    for r in range(TP):
        with safe_open(str(a / f"rank{r}.safetensors"), "pt") as fa, \
                safe_open(str(b / f"rank{r}.safetensors"), "pt") as fb:
            ka, kb = set(fa.keys()), set(fb.keys())
            assert ka == kb, f"rank {r}: {sorted(ka ^ kb)[:5]} not in both"
            for k in sorted(ka):
                ta, tb = fa.get_tensor(k), fb.get_tensor(k)
                assert (ta.shape, ta.dtype) == (tb.shape, tb.dtype), f"rank {r} {k}: {ta.shape}"
                n += 1
                ba, bb = ta.reshape(-1).view(torch.uint8), tb.reshape(-1).view(torch.uint8)
                same += bool(torch.equal(ba, bb))
    return {"tensors": n, "bit_identical": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size_gb", type=float, default=1.0, help="base model size (float16 weights)")
    ap.add_argument("--workdir", type=Path, help="cache and outputs (default: a temp dir path)",
                    default=Path(tempfile.gettempdir()) / "trtllm-medusa-bench")
    ap.add_argument("--workers", type=int, default=1, help="ours: --workers")
    ap.add_argument("--repeat", type=int, default=1, help="runs each (min wall, max RSS)")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        return child(json.loads(args._child))
    from tqdm import tqdm

    work = args.workdir.resolve()
    base, heads = build_inputs(work, args.size_gb, args.quiet)
    in_base = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    in_heads = (heads / "medusa_lm_head.safetensors").stat().st_size
    runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
    for _ in tqdm(range(args.repeat), desc="runs", disable=args.quiet, file=sys.stderr):
        for kind in runs:
            spec = {"kind": kind, "base": str(base), "heads": str(heads), "workers": args.workers,
                    "quiet": args.quiet, "dst": str(work / f"out-{kind}"),
                    "result": str(work / f"result-{kind}.json")}
            runs[kind].append(measure(spec))
    res: dict = {"size_gb": args.size_gb, "tp_size": TP, "dtype": "float16", "runs": runs,
                 "workers": args.workers, "base_bytes": in_base, "heads_bytes": in_heads}
    pick = {"wall_s": min, "peak_rss_mb": max, "peak_anon_mb": max, "bytes_written": max}
    ok = {kind: all(r["ok"] for r in rs) for kind, rs in runs.items()}
    res["summary"] = summ = {kind: {k: f(r[k] for r in rs) if ok[kind] else None
                                    for k, f in pick.items()} for kind, rs in runs.items()}
    o, b = summ["ours"], summ["baseline"]
    lines = [f"Qwen2 fp16 base {in_base / MB:.0f} MB + {MEDUSA_HEADS} heads "
             f"{in_heads / MB:.0f} MB, tp_size {TP}, float16, ours workers {args.workers}, "
             f"repeat {args.repeat}",
             f"{'':18}{'ours':>12}{'baseline':>12}{'ours/base':>12}"]

    def fmt(v, scale: float) -> str:
        return "failed" if v is None else f"{v / scale:.1f}"

    rows = (("wall_s", "s", 1), ("peak_rss_mb", "MB", 1), ("peak_anon_mb", "MB", 1),
            ("bytes_written", "MB", MB))
    for key, unit, scale in rows:
        vo, vb = o[key], b[key]
        ratio = f"{vo / vb:.2f}" if vo is not None and vb else "-"
        label = f"{key.removesuffix('_s').removesuffix('_mb')} ({unit})"
        lines.append(f"{label:<18}{fmt(vo, scale):>12}{fmt(vb, scale):>12}{ratio:>12}")
    try:
        assert ok["ours"] and ok["baseline"], "a conversion failed (its traceback is on stderr)"
        res["compare"] = cmp = compare(work / "out-ours", work / "out-baseline")
        lines.append(f"same tensor names/shapes/dtypes on {TP} ranks: yes "
                     f"({cmp['tensors']} tensors, {cmp['bit_identical']} bit-identical)")
    except AssertionError as exc:
        res["compare"] = cmp = {"error": str(exc)}
        lines.append(f"NOT COMPARABLE: {exc}")
    for label, ckpt in (("base + heads", in_base + in_heads), ("base only", in_base)):
        limit = 0.3 * ckpt / MB + 300
        verdict = "PASS" if o["peak_rss_mb"] is not None and o["peak_rss_mb"] < limit else "FAIL"
        res.setdefault("target", {})[label] = {"limit_mb": limit, "pass": verdict == "PASS"}
        rss = "failed" if o["peak_rss_mb"] is None else f"{o['peak_rss_mb']:.0f} MB"
        lines.append(f"{verdict}: ours peak RSS {rss} < 0.3 x {ckpt / MB:.0f} MB ({label}) + 300 MB"
                     f" = {limit:.0f} MB")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    sys.exit(0 if "error" not in cmp and cmp["bit_identical"] == cmp["tensors"] else 1)


if __name__ == "__main__":
    main()
