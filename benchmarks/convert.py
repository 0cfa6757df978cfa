#!/usr/bin/env python3
"""Conversion time and peak memory: `cp -r` of the inputs (the floor), ours, and an upstream-style
baseline, side by side in one run, at several sizes and for two dtype pairs (tp 2).

For each --sizes value (GB of base weights) and each --dtypes source dtype SRC (converted to float16),
builds once, cached in --workdir, a synthetic Qwen2 base of that size in SRC (sharded safetensors +
index json) and 4 FasterDecoding Medusa heads (medusa_lm_head.safetensors). Every contender runs in a
fresh subprocess (peak RSS from os.wait4; anonymous RSS sampled from /proc/self/status):

* cp: `cp -r BASE HEADS DST/` - moving the bytes and nothing else; cp_sync: the same, then `sync` on
  every copied file (durable, as ours_fsync);
* ours: trtllm_medusa_ports.conversion.convert.convert into a new directory with the parameter-shape cache warm
  (every conversion of a config after its first) and the package byte-compiled, as an installed
  copy is; like cp it leaves the data to the system's
  writeback; ours_fsync: the same with --fsync (the rank files are on disk before the output
  appears, which convert always does when it replaces an existing checkpoint); ours_cold: ours with
  an empty cache, so the shape check imports transformers and builds the model on the meta device;
* baseline: upstream convert_checkpoint.py's way - from_pretrained, heads loaded whole, each rank's
  dict in memory, safetensors save_file per rank.

ours and baseline must write the same tensors, bit for bit (checked). The inputs are read once before
timing, so every contender finds them in the page cache. Before each measured run of every contender,
outside the timed region, the previous output is removed, ``os.sync()`` flushes every dirty page and
the script waits SETTLE_S seconds: no contender pays for the writeback of the one before it. The load
average before each run is recorded: these machines are shared, and contention shows in wall times.
Run: python benchmarks/convert.py [--sizes 0.5,1,2,4] [--dtypes float16,bfloat16] [--repeat 2] [--out F]
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
TARGET_DTYPE = "float16"
CONTENDERS = ("cp", "cp_sync", "ours_cold", "ours", "ours_fsync", "baseline")  # ours reads the cache ours_cold filled
#: seconds waited after os.sync() before each measured run (not timed)
SETTLE_S = 1.0


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
    return 2 * math.prod(shape)  # float16 and bfloat16


def rand(name: str, shape: tuple[int, ...], g, dtype):
    import torch

    t = torch.randn(shape, generator=g)
    return (1 + 0.1 * t if name.endswith("norm.weight") else 0.02 * t).to(getattr(torch, dtype))


def build_inputs(workdir: Path, size_gb: float, dtype: str, quiet: bool) -> tuple[Path, Path]:
    """The cached base and heads directories (built unless a previous run finished them)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import Qwen2Config

    per_layer = sum(nbytes(s) for _, s in base_tensors(1)[1:-2])
    n_layers = max(1, round((size_gb * 1e9 - nbytes((2, VOCAB, H))) / per_layer))
    tag = "fp16" if dtype == "float16" else "bf16"
    base, heads = workdir / f"qwen2-{n_layers}L-{tag}", workdir / f"medusa{MEDUSA_HEADS}-{tag}"
    g = torch.Generator().manual_seed(0)
    if not (base / "DONE").exists():
        tmp = base.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        Qwen2Config(hidden_size=H, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
                    intermediate_size=INTER, vocab_size=VOCAB, num_hidden_layers=n_layers,
                    max_position_embeddings=4096, tie_word_embeddings=False, dtype=dtype,
                    architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp)
        shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
        for name, shape in base_tensors(n_layers):
            if shards[-1] and sum(nbytes(s) for _, s in shards[-1]) + nbytes(shape) > SHARD_BYTES:
                shards.append([])
            shards[-1].append((name, shape))
        index: dict = {"metadata": {"total_size": 0}, "weight_map": {}}
        bar = tqdm(total=sum(len(s) for s in shards), desc=f"build base {size_gb} GB {dtype}", disable=quiet,
                   file=sys.stderr)
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            sd = {}
            for name, shape in shard:
                sd[name] = rand(name, shape, g, dtype)
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
        sd = {f"{h}.{k}": rand(k, v, g, dtype) for h in range(MEDUSA_HEADS) for k, v in parts.items()}
        save_file(sd, str(heads / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
        (heads / "config.json").write_text(json.dumps({"medusa_num_heads": MEDUSA_HEADS,
                                                       "medusa_num_layers": 1}))
        (heads / "DONE").write_text("")
    return base, heads


def rank_weights(sd: dict, heads: dict, n_layers: int, rank: int) -> dict:
    """One rank's TensorRT-LLM tensors, built in memory from the whole model (upstream's way)."""
    from trtllm_medusa_ports.weights.sharding import Split, shard

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
    if spec["kind"] in ("ours", "ours_cold", "ours_fsync"):
        from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert

        res = convert(ConvertOptions(model_dir=Path(spec["base"]), medusa_model_dir=Path(spec["heads"]),
                                     output_dir=Path(spec["dst"]), dtype=TARGET_DTYPE, tp_size=TP,
                                     quiet=True, workers=spec["workers"], overwrite=True,
                                     fsync=spec["kind"] == "ours_fsync"))
        moves: dict[str, int] = {}
        for kind in res.moves.values():
            moves[kind] = moves.get(kind, 0) + 1
        extra = {"jobs_by_path": moves}
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
        extra = {}
    hwm = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0])
    res = {"seconds_inside": time.time() - start, "peak_anon_mb": peak_anon[0] * 1024 / MB,
           "vm_hwm_mb": hwm * 1024 / MB, **extra}
    Path(spec["result"]).write_text(json.dumps(res))


def measure(spec: dict) -> dict:
    shutil.rmtree(spec["dst"], ignore_errors=True)
    env = dict(os.environ)
    if spec["kind"] == "ours_cold":
        shutil.rmtree(spec["cache"], ignore_errors=True)
    env["TRTLLM_MEDUSA_CACHE"] = spec["cache"]
    if spec["kind"] in ("cp", "cp_sync"):
        Path(spec["dst"]).mkdir(parents=True)
        cmd = ["cp", "-r", spec["base"], spec["heads"], spec["dst"] + "/"]
        if spec["kind"] == "cp_sync":  # and on disk, as ours is before it commits the output (fsync)
            cmd = ["sh", "-c", '"$@" && find "$0" -type f -exec sync {} +', spec["dst"], *cmd]
    else:
        cmd = [sys.executable, __file__, "--_child", json.dumps(spec)]
    # the previous contender's (and the removal's) dirty pages go to disk now, not during this run
    os.sync()
    time.sleep(SETTLE_S)
    load = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=sys.stderr, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    res = {"ok": rc == 0, "returncode": rc, "wall_s": time.time() - start,
           "peak_rss_mb": usage.ru_maxrss * 1024 / MB, "load_avg_1min_before": load}
    if rc == 0 and not spec["kind"].startswith("cp"):
        res.update(json.loads(Path(spec["result"]).read_text()))
    if rc == 0:
        res["bytes_written"] = sum(f.stat().st_size for f in Path(spec["dst"]).rglob("*") if f.is_file())
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


def warm(paths: list[Path]) -> None:
    """Read the inputs once so that every contender finds them in the page cache."""
    for p in paths:
        for f in sorted(p.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(16 << 20):
                        pass


def helper(*argv: str) -> dict:
    """Build inputs or compare outputs in a subprocess: this process stays small (no torch), since a
    child's peak RSS as os.wait4 reports it starts from its parent's RSS at fork time."""
    out = subprocess.run([sys.executable, __file__, *argv], stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_case(work: Path, size: float, dtype: str, args) -> dict:
    built = helper("--_build", json.dumps([str(work), size, dtype, args.quiet]))
    base, heads = Path(built["base"]), Path(built["heads"])
    in_base = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    in_heads = (heads / "medusa_lm_head.safetensors").stat().st_size
    cache = work / "shape-cache"
    runs: dict[str, list[dict]] = {k: [] for k in CONTENDERS}
    warm([base, heads])
    for _ in range(args.repeat):
        for kind in CONTENDERS:
            spec = {"kind": kind, "base": str(base), "heads": str(heads), "workers": args.workers,
                    "quiet": args.quiet, "dst": str(work / f"out-{kind}"), "cache": str(cache),
                    "result": str(work / f"result-{kind}.json")}
            runs[kind].append(measure(spec))
    pick = {"wall_s": min, "peak_rss_mb": max, "vm_hwm_mb": max, "peak_anon_mb": max, "bytes_written": max}
    summ: dict = {}
    for kind, rs in runs.items():
        ok = all(r["ok"] for r in rs)
        summ[kind] = {k: (f(r[k] for r in rs) if ok and k in rs[0] else None) for k, f in pick.items()}
    case = {"size_gb": size, "source_dtype": dtype, "target_dtype": TARGET_DTYPE, "tp_size": TP,
            "base_bytes": in_base, "heads_bytes": in_heads, "runs": runs, "summary": summ,
            "jobs_by_path": runs["ours"][0].get("jobs_by_path")}
    o, c, b = summ["ours"]["wall_s"], summ["cp"]["wall_s"], summ["baseline"]["wall_s"]
    oc = summ["ours_cold"]["wall_s"]
    case["ratios"] = {
        "ours_over_cp": o / c if o and c else None,
        "ours_cold_over_cp": oc / c if oc and c else None,
        "ours_over_cp_sync": o / summ["cp_sync"]["wall_s"] if o and summ["cp_sync"]["wall_s"] else None,
        "ours_fsync_over_cp_sync": (summ["ours_fsync"]["wall_s"] / summ["cp_sync"]["wall_s"]
                                    if summ["ours_fsync"]["wall_s"] and summ["cp_sync"]["wall_s"] else None),
        "baseline_over_ours": b / o if o and b else None,
        "baseline_over_ours_cold": b / oc if oc and b else None,
        "ours_rss_over_baseline": (summ["ours"]["peak_rss_mb"] / summ["baseline"]["peak_rss_mb"]
                                   if summ["ours"]["peak_rss_mb"] and summ["baseline"]["peak_rss_mb"] else None),
    }
    try:
        assert all(r["ok"] for r in runs["ours"] + runs["baseline"]), "a conversion failed (traceback on stderr)"
        case["compare"] = helper("--_compare", json.dumps([str(work / "out-ours"), str(work / "out-baseline")]))
    except AssertionError as exc:
        case["compare"] = {"error": str(exc)}
    for kind in CONTENDERS:  # the next size needs the disk space
        shutil.rmtree(work / f"out-{kind}", ignore_errors=True)
    return case


def linear_fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares time = intercept + slope x size, and R^2: is the time linear in the size?"""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss = sum((y - my) ** 2 for y in ys)
    res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"seconds_per_gb": slope, "intercept_s": intercept, "r2": 1 - res / ss if ss else 1.0}


def compile_package() -> None:
    """Byte-compile the package, as ``pip install`` does: without it (an editable install under
    PYTHONDONTWRITEBYTECODE=1, say) every run compiles the package's sources again, 0.04 s of a
    small conversion's start that no installed copy pays."""
    import compileall

    import trtllm_medusa_ports

    compileall.compile_dir(str(Path(trtllm_medusa_ports.__file__).parent), quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.5,1,2,4", help="base model sizes in GB (comma-separated)")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="source dtypes, each converted to float16")
    ap.add_argument("--workdir", type=Path, help="cache and outputs (default: a temp dir path)",
                    default=Path(tempfile.gettempdir()) / "trtllm-medusa-bench")
    ap.add_argument("--workers", type=int, default=1, help="ours: --workers")
    ap.add_argument("--repeat", type=int, default=2, help="runs each (min wall, max RSS)")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_build", help=argparse.SUPPRESS)
    ap.add_argument("--_compare", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        return child(json.loads(args._child))
    if args._build:
        w, size, dtype, quiet = json.loads(args._build)
        base, heads = build_inputs(Path(w), size, dtype, quiet)
        return print(json.dumps({"base": str(base), "heads": str(heads)}))
    if args._compare:
        a, b = json.loads(args._compare)
        return print(json.dumps(compare(Path(a), Path(b))))
    compile_package()
    work = args.workdir.resolve()
    sizes = [float(x) for x in args.sizes.split(",")]
    dtypes = args.dtypes.split(",")
    cases = []
    print(f"{'case':<22}{'cp s':>7}{'cp+sync':>8}{'ours s':>8}{'fsync s':>8}{'cold s':>8}{'base s':>8}{'ours/cp':>9}{'base/ours':>10}"
          f"{'ours MB':>9}{'base MB':>9}{'load':>6}  identical")
    for dtype in dtypes:
        for size in sizes:
            case = run_case(work, size, dtype, args)
            cases.append(case)
            s, r = case["summary"], case["ratios"]

            def f(v, fmt="{:.1f}"):
                return "-" if v is None else fmt.format(v)

            cmp = case["compare"]
            same = cmp.get("error") or f"{cmp['bit_identical']}/{cmp['tensors']}"
            load = max(x["load_avg_1min_before"] for rs in case["runs"].values() for x in rs)
            print(f"{size:>4} GB {dtype:>8}->fp16 {f(s['cp']['wall_s']):>7}{f(s['cp_sync']['wall_s']):>8}"
                  f"{f(s['ours']['wall_s']):>8}{f(s['ours_fsync']['wall_s']):>8}"
                  f"{f(s['ours_cold']['wall_s']):>8}{f(s['baseline']['wall_s']):>8}"
                  f"{f(r['ours_over_cp'], '{:.2f}'):>9}{f(r['baseline_over_ours'], '{:.2f}'):>10}"
                  f"{f(s['ours']['peak_rss_mb'], '{:.0f}'):>9}{f(s['baseline']['peak_rss_mb'], '{:.0f}'):>9}"
                  f"{load:>6.1f}  {same}", flush=True)
    res: dict = {"tp_size": TP, "target_dtype": TARGET_DTYPE, "repeat": args.repeat, "workers": args.workers,
                 "cpu_count": os.cpu_count(), "cases": cases, "linearity": {}, "targets": {}}
    for dtype in dtypes:
        rows = [c for c in cases if c["source_dtype"] == dtype and c["summary"]["ours"]["wall_s"]]
        if len(rows) >= 2:
            res["linearity"][dtype] = {k: linear_fit([c["size_gb"] for c in rows],
                                                     [c["summary"][k]["wall_s"] for c in rows])
                                       for k in ("cp", "cp_sync", "ours", "ours_fsync", "ours_cold", "baseline")}
        same = dtype == TARGET_DTYPE
        limit = 1.5 if same else 2.5
        res["targets"][dtype] = {
            f"ours <= {limit} x cp": all((c["ratios"]["ours_over_cp"] or 99) <= limit for c in rows),
            f"ours --fsync <= {limit} x cp + sync": all((c["ratios"]["ours_fsync_over_cp_sync"] or 99) <= limit
                                                       for c in rows),
            "ours >= 3 x faster than baseline": all((c["ratios"]["baseline_over_ours"] or 0) >= 3 for c in rows),
            "ours peak RSS <= 300 MB": all((c["summary"]["ours"]["peak_rss_mb"] or 1e9) <= 300 for c in rows),
            "bit-identical to baseline": all(c["compare"].get("bit_identical") == c["compare"].get("tensors")
                                             for c in rows),
        }
    print(json.dumps({"linearity": res["linearity"], "targets": res["targets"]}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    ok = all(c["compare"].get("bit_identical") == c["compare"].get("tensors") for c in cases)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
