#!/usr/bin/env python3
"""Quantized conversion time and peak memory, beside `cp -r` and the float conversion, in one run.

Inputs: the synthetic Qwen2 bases and Medusa heads of benchmarks/convert.py (same builder, same cache in
--workdir), float16, tp 2. Contenders, each in a fresh subprocess, fastest of --repeat:

* cp: `cp -r BASE HEADS DST/`;
* float: `convert --dtype float16` (the byte path);
* int8_wo, int4_wo: weight-only - the checkpoint keeps float weights (TensorRT-LLM quantizes at load), so
  the conversion moves the same bytes as the float one;
* fp8: FP8 weights with per-tensor scales, in two timed phases: the calibration (the base in float32 over
  --calib_size samples of --calib_tokens ids; time per sample and its peak RSS reported apart) and the
  conversion given that calibration (two chunked passes over every quantized weight on the byte path:
  amax, then the scaled cast), whose peak anonymous RSS is sampled after the calibration model is gone.

Ratios: ``over_cp`` is the whole process (start, imports, conversion) over ``cp -r``; ``phase_over_cp``
the conversion phase alone (``convert()`` inside the process), which for FP8 is what a real run adds
after its calibration (the calibration has imported torch by then; this child imports it afresh, about
1-3 s here, counted in ``over_cp``).

Run: python benchmarks/quantized_convert.py [--sizes 1,4] [--repeat 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import convert as bench  # noqa: E402  (benchmarks/convert.py: inputs, cp timing, settling)

FORMATS = ("float", "int8_wo", "int4_wo", "fp8")
RUNS = ("cp", "warmup", "calibrate") + FORMATS  # warmup: fills the shape cache (a config's first conversion)


def child(spec: dict) -> None:
    peak = {"anon": 0}
    track = {"on": True}

    def sample() -> None:
        while True:
            if track["on"]:
                st = Path("/proc/self/status").read_text().split("RssAnon:")[1]
                peak["anon"] = max(peak["anon"], int(st.split()[0]) * 1024)
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    kind, out = spec["kind"], {}
    if kind == "calibrate":  # its own process: its memory is the calibration model's, not the conversion's
        from trtllm_medusa_ports.archs import adapter_for
        from trtllm_medusa_ports.quant.calibrate import calibrate

        vocab = bench.VOCAB
        samples = [[(31 * i + 7 * j) % vocab for i in range(spec["calib_tokens"])] for j in range(spec["calib_size"])]
        t0 = time.time()
        calibration = calibrate(spec["base"], adapter_for("Qwen2ForCausalLM"), bench.TARGET_DTYPE, samples,
                                source="synthetic ids")
        out["calibration_s"] = time.time() - t0
        out["calibration_s_per_sample"] = out["calibration_s"] / len(samples)
        out["calibration_peak_anon_mb"] = peak["anon"] / bench.MB
        Path(spec["calibration"]).write_text(calibration.to_json())
        Path(spec["result"]).write_text(json.dumps(out))
        return
    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert

    calibration = None
    if kind == "fp8":
        from trtllm_medusa_ports.quant.calibrate import Calibration

        calibration = Calibration.from_json(Path(spec["calibration"]).read_text())
    flags = {"int8_wo": {"qformat": "int8_wo"}, "int4_wo": {"qformat": "int4_wo"}, "fp8": {"qformat": "fp8"}}
    t0 = time.time()
    convert(ConvertOptions(model_dir=Path(spec["base"]), medusa_model_dir=Path(spec["heads"]),
                           output_dir=Path(spec["dst"]), dtype=bench.TARGET_DTYPE, tp_size=bench.TP, quiet=True,
                           overwrite=True, calibration=calibration, **flags.get(kind, {})))
    out["convert_s"] = time.time() - t0
    out["convert_peak_anon_mb"] = peak["anon"] / bench.MB
    Path(spec["result"]).write_text(json.dumps(out))


def measure(spec: dict) -> dict:
    shutil.rmtree(spec["dst"], ignore_errors=True)
    if spec["kind"] == "cp":
        Path(spec["dst"]).mkdir(parents=True)
        cmd = ["cp", "-r", spec["base"], spec["heads"], spec["dst"] + "/"]
    else:
        cmd = [sys.executable, __file__, "--_child", json.dumps(spec)]
    os.sync()
    time.sleep(bench.SETTLE_S)
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=sys.stderr, env={**os.environ, "TRTLLM_MEDUSA_CACHE": spec["cache"]})
    _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    res = {"ok": rc == 0, "wall_s": time.time() - start, "peak_rss_mb": usage.ru_maxrss * 1024 / bench.MB,
           "load_avg_1min_before": os.getloadavg()[0]}
    if rc == 0 and spec["kind"] != "cp":
        res.update(json.loads(Path(spec["result"]).read_text()))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/trtllm-medusa-bench"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--calib_size", type=int, default=8)
    ap.add_argument("--calib_tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--_child")
    args = ap.parse_args()
    if args._child:
        child(json.loads(args._child))
        return
    bench.compile_package()
    cases = []
    for size in (float(x) for x in args.sizes.split(",")):
        built = bench.helper("--_build", json.dumps([str(args.workdir), size, "float16", True]))
        base, heads = built["base"], built["heads"]
        bench.warm([Path(base), Path(heads)])
        runs: dict[str, list] = {k: [] for k in RUNS}
        cache = str(args.workdir / "shape-cache")
        for _ in range(args.repeat):
            for kind in runs:
                spec = {"kind": kind, "base": base, "heads": heads, "dst": str(args.workdir / f"q-out-{kind}"),
                        "cache": cache, "result": str(args.workdir / f"q-result-{kind}.json"),
                        "calib_size": args.calib_size, "calib_tokens": args.calib_tokens,
                        "calibration": str(args.workdir / "q-calibration.json")}
                if kind == "warmup":
                    spec["kind"] = "float"
                runs[kind].append(measure(spec))
                print(size, kind, json.dumps(runs[kind][-1]), file=sys.stderr, flush=True)
        best = {k: min(rs, key=lambda r: r["wall_s"]) for k, rs in runs.items()}
        cp = best["cp"]["wall_s"]
        case = {"size_gb": size, "runs": runs, "over_cp": {}}
        for k in FORMATS:
            case["over_cp"][k] = round(best[k]["wall_s"] / cp, 2)  # fp8: given its calibration (run apart)
        case["over_float"] = {k: round(best[k]["wall_s"] / best["float"]["wall_s"], 2) for k in FORMATS}
        # the conversion phase alone (convert() inside the process, its imports done): for FP8 this is the
        # conversion after its calibration, where a real run has imported torch already (calibrating needs it)
        phase = {k: min(r["convert_s"] for r in runs[k] if r["ok"]) for k in FORMATS}
        case["phase_over_cp"] = {k: round(v / cp, 2) for k, v in phase.items()}
        case["phase_s"] = {k: round(v, 3) for k, v in phase.items()}
        case["calibration"] = {key: best["calibrate"].get(key) for key in (
            "calibration_s", "calibration_s_per_sample", "calibration_peak_anon_mb")} | {
            "samples": args.calib_size, "tokens_per_sample": args.calib_tokens, "peak_rss_mb": best["calibrate"]["peak_rss_mb"]}
        case["peak_rss_mb"] = {k: round(best[k]["peak_rss_mb"], 1) for k in FORMATS}
        cases.append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "runs"}, indent=1))
        for kind in runs:
            shutil.rmtree(args.workdir / f"q-out-{kind}", ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps({"tp": bench.TP, "target_dtype": bench.TARGET_DTYPE, "cases": cases}, indent=2))


if __name__ == "__main__":
    main()
