"""Regenerate the ModelOpt 0.21.1 TensorRT-LLM checkpoint fixtures in tests/fixtures/modelopt/.

What it makes (all under ``tests/fixtures/modelopt/``):

* ``hf_qwen2/``      a tiny random Qwen2ForCausalLM (hidden 128, intermediate 256, 2 layers,
                     4 heads, 2 KV heads, vocab 250, untied lm_head) saved by transformers 4.47.1
                     with ``save_pretrained(safe_serialization=True)`` in float16.
* ``calib_ids.json`` the calibration token ids (16 sequences of 32 ids in [0, 250)), fed one
                     sequence at a time, in order, as ``model(input_ids=torch.tensor([seq]))``;
                     ``calib_ids.jsonl`` the same as JSON lines (``verify --calib_dataset``).
* one folder per export, each written by ModelOpt's own
  ``modelopt.torch.export.export_tensorrt_llm_checkpoint(model, decoder_type="qwen",
  dtype=torch.float16, export_dir=..., inference_tensor_parallel=TP, inference_pipeline_parallel=1)``
  after ``mtq.quantize(model, CONFIG, forward_loop)`` on a freshly loaded copy of ``hf_qwen2/``:

  ``fp8/``          mtq.FP8_DEFAULT_CFG, no KV-cache quantization, tp 1
  ``fp8_kv/``       FP8_DEFAULT_CFG + ``quant_cfg["*output_quantizer"] = {"num_bits": (4, 3),
                    "axis": None, "enable": True}`` (how examples/llm_ptq/hf_ptq.py of the
                    0.21.1 release turns on the FP8 KV cache), tp 1
  ``fp8_tp2/``      as ``fp8/`` but inference_tensor_parallel=2 (rank0 + rank1)
  ``int4_awq/``     mtq.INT4_AWQ_CFG (awq_lite, block size 128), tp 1
  ``int4_awq_g64/`` INT4_AWQ_CFG with ``block_sizes[-1] = 64``, tp 1
  ``int8_sq/``      mtq.INT8_SMOOTHQUANT_CFG, tp 1

  ``config.json`` and ``rank*.safetensors`` in those folders are exactly what ModelOpt wrote
  (``config.json["producer"]`` holds the ModelOpt version).  The only file this script adds
  to an export folder is ``modelopt_amax.json``: the per-tensor (scalar) amax of every enabled
  quantizer of the calibrated model just before export, for tests that want to re-derive a
  scale (e.g. the FP8 KV-cache scale, which ModelOpt floors at 1.0).

Environment (this is NOT the project's environment, and CI never runs this script):

    python3 -m venv /work/venvs/modelopt
    /work/venvs/modelopt/bin/pip install torch==2.13.0            # the CPU wheel, first
    /work/venvs/modelopt/bin/pip install 'nvidia-modelopt[torch]==0.21.1' transformers==4.47.1 torch==2.13.0
    /work/venvs/modelopt/bin/python scripts/make_modelopt_fixtures.py [--verify-json PATH]

Everything runs on CPU.  Work-arounds applied inside this script (no installed file is edited):

* ``torchvision`` (pulled in by nvidia-modelopt[torch]) is a CUDA build that cannot load next
  to the CPU torch; it is hidden (``sys.modules["torchvision"] = None`` and transformers'
  ``_torchvision_available = False``).  Nothing used here needs it.
* ModelOpt 0.21.1 imports, at load time only, ``onnx`` (not a dependency of the [torch] extra)
  and ``torch.onnx._globals`` / ``torch.onnx._type_utils`` / ``torch.onnx._internal.jit_utils``
  (removed from torch 2.13).  When missing they are replaced by stub modules: ``onnx.TensorProto``
  with the dtype enum ints ModelOpt reads, ``GLOBALS.in_onnx_export = False``, an empty
  ``_type_utils`` module and a ``jit_utils.GraphContext`` placeholder class.  They are only
  used by ModelOpt's ONNX export, never by the TensorRT-LLM export.
* ModelOpt's FP8 fake quantization needs its CUDA extension.  Calibration and export never
  fake-quantize (max calibration only observes), but the script's verification step does, so
  ``modelopt.torch.quantization.tensor_quant.scaled_e4m3_impl`` is replaced with a CPU version
  of its own unfused branch (``fake_e4m3fy(x * 448 / amax) * amax / 448``, values below 2**-24
  zeroed), where ``fake_e4m3fy`` is a saturating round-to-nearest cast through
  ``torch.float8_e4m3fn``.
* The script re-executes itself with ``PYTHONHASHSEED=0`` because ModelOpt builds
  ``quantization.exclude_modules`` from a Python ``set``; with a fixed hash seed its order
  in config.json is reproducible.

The verification numbers (stored weight de-quantized with the stored scales, compared with
ModelOpt's fake-quantized weights of the model before export) are printed and, with
``--verify-json``, written to a file; they are not part of the fixtures.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import shutil
import sys
import types
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "modelopt"
HF_DIR = OUT / "hf_qwen2"
CALIB_PATH = OUT / "calib_ids.json"

SEED = 0
CALIB_SEED = 1234
N_CALIB, CALIB_LEN, VOCAB = 16, 32, 250
INIT_STD = 0.1  # instead of Qwen2's 0.02, so activations and logits are not near zero

STUBBED: list[str] = []


# --------------------------------------------------------------------------- imports
def _stub_module(name: str, **attrs):
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    STUBBED.append(name)
    return mod


def _prepare_imports():
    # torchvision from PyPI is a CUDA build (needs libc10_cuda.so); hide it from transformers.
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules["torchvision"] = None  # type: ignore[assignment]
        import transformers.utils.import_utils as iu

        iu._torchvision_available = False
        STUBBED.append("torchvision (hidden)")

    import torch
    import torch.onnx  # noqa: F401

    try:
        import onnx  # noqa: F401
    except ImportError:

        class TensorProto:  # the onnx.TensorProto.DataType values ModelOpt's onnx export reads
            FLOAT = 1
            UINT8 = 2
            INT8 = 3
            FLOAT16 = 10
            BFLOAT16 = 16
            FLOAT8E4M3FN = 17
            FLOAT4E2M1 = 23

        _stub_module("onnx", TensorProto=TensorProto)

    def _need(name):
        try:
            importlib.import_module(name)
            return False
        except ImportError:
            return True

    if _need("torch.onnx._globals"):

        class _Globals:
            in_onnx_export = False

        _stub_module("torch.onnx._globals", GLOBALS=_Globals())
    if _need("torch.onnx._type_utils"):
        _stub_module("torch.onnx._type_utils")
    import torch.onnx._internal  # noqa: F401

    if _need("torch.onnx._internal.jit_utils"):

        class GraphContext:
            pass

        _stub_module("torch.onnx._internal.jit_utils", GraphContext=GraphContext)
    return torch


torch = _prepare_imports()
import modelopt  # noqa: E402
import modelopt.torch.quantization as mtq  # noqa: E402
import modelopt.torch.quantization.tensor_quant as _tq  # noqa: E402
import transformers  # noqa: E402
from modelopt.torch.export import export_tensorrt_llm_checkpoint  # noqa: E402
from modelopt.torch.quantization.nn import TensorQuantizer  # noqa: E402
from modelopt.torch.quantization.utils import is_quantized_linear  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402


def _cpu_scaled_e4m3_impl(inputs, amax, disable_fused_kernel=False):
    """CPU copy of ModelOpt 0.21.1 tensor_quant.scaled_e4m3_impl's unfused branch."""
    zero_mask = inputs.abs() < 1.0 / (1 << 24)

    def fake_e4m3fy(x):
        x32 = x.float()
        return x32.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32).to(x.dtype)

    if amax is None:
        outputs = fake_e4m3fy(inputs)
    else:
        scale = 448.0 / amax
        outputs = fake_e4m3fy(inputs * scale) / scale
    outputs[zero_mask] = 0.0
    return outputs


_tq.scaled_e4m3_impl = _cpu_scaled_e4m3_impl
STUBBED.append("modelopt.torch.quantization.tensor_quant.scaled_e4m3_impl (CPU version)")


# --------------------------------------------------------------------------- base model
def make_base():
    torch.manual_seed(SEED)
    config = Qwen2Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="float16",
        initializer_range=INIT_STD,
    )
    model = Qwen2ForCausalLM(config)  # post_init draws N(0, INIT_STD) weights, zero biases
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # RMSNorm gains in [0.5, 1.5), plus two outlier channels in every input
                # layernorm so AWQ / SmoothQuant have something to smooth.
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
                if "input_layernorm" in name:
                    p[7] *= 6.0
                    p[42] *= 4.0
            elif name.endswith(".bias"):  # q/k/v biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    model = model.half().eval()
    if HF_DIR.exists():
        shutil.rmtree(HF_DIR)
    model.save_pretrained(HF_DIR, safe_serialization=True)


def make_calib():
    g = torch.Generator().manual_seed(CALIB_SEED)
    ids = torch.randint(0, VOCAB, (N_CALIB, CALIB_LEN), generator=g).tolist()
    CALIB_PATH.write_text("[\n" + ",\n".join(json.dumps(s) for s in ids) + "\n]\n")
    # the same samples as JSON lines, the form `trtllm-medusa verify --calib_dataset` reads
    CALIB_PATH.with_suffix(".jsonl").write_text("".join(json.dumps({"input_ids": s}) + "\n" for s in ids))


def load_calib():
    return json.loads(CALIB_PATH.read_text())


def forward_loop_factory(ids):
    def forward_loop(model):
        with torch.no_grad():
            for seq in ids:
                model(input_ids=torch.tensor([seq]))

    return forward_loop


# --------------------------------------------------------------------------- configs
def cfg_fp8():
    return copy.deepcopy(mtq.FP8_DEFAULT_CFG)


def cfg_fp8_kv():
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    # examples/llm_ptq/hf_ptq.py (0.21.1 release): enable_quant_kv_cache for non-int8_sq formats
    cfg["quant_cfg"]["*output_quantizer"] = {"num_bits": (4, 3), "axis": None, "enable": True}
    return cfg


def cfg_awq(block_size=None):
    cfg = copy.deepcopy(mtq.INT4_AWQ_CFG)
    if block_size is not None:  # as hf_ptq.py --awq_block_size does
        wq = cfg["quant_cfg"]["*weight_quantizer"]
        if isinstance(wq, list):
            wq = wq[0]
        wq["block_sizes"][-1] = block_size
    return cfg


def cfg_sq():
    return copy.deepcopy(mtq.INT8_SMOOTHQUANT_CFG)


EXPORTS = [
    ("fp8", cfg_fp8, 1),
    ("fp8_kv", cfg_fp8_kv, 1),
    ("fp8_tp2", cfg_fp8, 2),
    ("int4_awq", lambda: cfg_awq(None), 1),
    ("int4_awq_g64", lambda: cfg_awq(64), 1),
    ("int8_sq", cfg_sq, 1),
]


# --------------------------------------------------------------------------- capture
def _amax_scalar(q):
    if not isinstance(q, TensorQuantizer) or not q.is_enabled:
        return None
    a = getattr(q, "amax", None)
    if a is None or a.numel() != 1:
        return None
    return float(a.float().item())


def capture(model):
    """Per quantized linear: smoothed weight, ModelOpt fake-quantized weight, scales."""
    ref, amax = {}, {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if not is_quantized_linear(m):
                continue
            wq = m.weight_quantizer
            entry = {"weight": m.weight.detach().clone()}
            if wq.is_enabled:
                # ModelOpt's fake quantization as the model's forward applies it (float16)
                entry["fake_quant"] = wq(m.weight).detach().clone()
                # the same quantizer on the float32-upcast weight (no float16 intermediates)
                entry["fake_quant_fp32"] = wq(m.weight.float()).detach().clone()
                entry["w_amax"] = wq.amax.detach().float().clone()
                entry["block_sizes"] = wq.block_sizes
            iq = m.input_quantizer
            pqs = getattr(iq, "_pre_quant_scale", None)
            if pqs is not None:
                entry["pre_quant_scale"] = pqs.detach().float().clone().squeeze()
            if iq.is_enabled and iq.amax is not None:
                entry["in_amax"] = iq.amax.detach().float().clone()
            ref[name] = entry
            rec = {}
            for qname in ("weight_quantizer", "input_quantizer", "output_quantizer"):
                v = _amax_scalar(getattr(m, qname, None))
                if v is not None:
                    rec[qname] = v
            if rec:
                amax[name] = rec
    return ref, amax


# --------------------------------------------------------------------------- verify
def _maxdiff(a, b):
    return float((a.float() - b.float()).abs().max().item())


def _n_other_code(deq, fq):
    """Elements that land on a different quantization grid point.

    Same grid point means equal up to rounding noise (< 1e-3 relative): neighbouring FP8
    values differ by >= 1/16 relative, INT4/INT8 values by a whole scale step.
    """
    tol = fq.float().abs() * 1e-3 + 1e-6
    return int(((deq.float() - fq.float()).abs() > tol).sum().item())


def unpack_int4(packed):
    """ModelOpt to_quantized_weight packing: int8 [out/2, in], byte [j, i] holds
    row 2j in the low nibble and row 2j+1 in the high nibble (two's-complement int4)."""
    p = packed.to(torch.int16) & 0xFF
    lo = p & 0x0F
    hi = (p >> 4) & 0x0F
    lo = torch.where(lo >= 8, lo - 16, lo)
    hi = torch.where(hi >= 8, hi - 16, hi)
    out2, in_dim = packed.shape
    w = torch.empty(out2 * 2, in_dim, dtype=torch.int16)
    w[0::2] = lo
    w[1::2] = hi
    return w


HF_OF = {  # TRT-LLM name -> list of HF module suffixes stacked along dim 0
    "attention.qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    "attention.dense": ["self_attn.o_proj"],
    "mlp.fc": ["mlp.gate_proj"],
    "mlp.gate": ["mlp.up_proj"],
    "mlp.proj": ["mlp.down_proj"],
}
ROW = {"attention.dense", "mlp.proj"}


def _dequant(kind, w, s, block=None):
    if kind == "fp8":
        return w.float() * s.float()
    if kind == "int8_sq":
        return w.float() * s.float()[:, None]
    if kind == "int4_awq":
        q = unpack_int4(w).float()
        blk = q.shape[1] // s.shape[1]
        return q * s.float()[:, torch.arange(q.shape[1]) // blk]
    raise ValueError(kind)


def verify(name, kind, tp, ref, export_dir):
    ranks = [load_file(str(export_dir / f"rank{r}.safetensors")) for r in range(tp)]
    base = load_file(str(HF_DIR / "model.safetensors"))
    res = {}
    for layer in range(2):
        for trt, hf_list in HF_OF.items():
            prefix = f"transformer.layers.{layer}.{trt}"
            hf = [ref[f"model.layers.{layer}.{h}"] for h in hf_list]
            rows = [e["weight"].shape[0] for e in hf]
            # per-rank de-quantization, then undo the TP split (qkv: per q/k/v slices)
            deq_ranks = []
            for st in ranks:
                deq_ranks.append(
                    _dequant(kind, st[prefix + ".weight"], st[prefix + ".weights_scaling_factor"])
                )
            if tp == 1:
                deq = deq_ranks[0]
            elif trt in ROW:
                deq = torch.cat(deq_ranks, dim=1)
            else:
                parts = [torch.split(d, [r // tp for r in rows]) for d in deq_ranks]
                deq = torch.cat([torch.cat([p[i] for p in parts]) for i in range(len(rows))])
            fq = torch.cat([e["fake_quant"] for e in hf])
            fq32 = torch.cat([e["fake_quant_fp32"] for e in hf])
            entry = {
                "shape": list(deq.shape),
                "max_abs_diff_vs_fake_quant": _maxdiff(deq, fq),
                "n_other_code_vs_fake_quant": _n_other_code(deq, fq),
                "max_abs_diff_vs_fake_quant_fp32": _maxdiff(deq, fq32),
                "n_other_code_vs_fake_quant_fp32": _n_other_code(deq, fq32),
            }
            if len(hf) == 3:
                for part, d, f, f32 in zip(
                    ("q", "k", "v"),
                    torch.split(deq, rows),
                    torch.split(fq, rows),
                    torch.split(fq32, rows),
                ):
                    entry[f"{part}_max_abs_diff_vs_fake_quant"] = _maxdiff(d, f)
                    entry[f"{part}_max_abs_diff_vs_fake_quant_fp32"] = _maxdiff(d, f32)
                    entry[f"{part}_n_other_code_vs_fake_quant_fp32"] = _n_other_code(d, f32)
            # reconstruction following the export source (resmoothing + shared scale)
            if kind == "fp8":
                s = max(float(e["w_amax"].max()) for e in hf) / 448.0
                rec = torch.cat([e["weight"] for e in hf]).float() / s
                rec = rec.to(torch.float8_e4m3fn).float() * s
            else:
                pqs = [e.get("pre_quant_scale") for e in hf]
                w_list = [e["weight"] for e in hf]
                if len(hf) == 3 and all(p is not None for p in pqs):
                    avg = (pqs[0].half() + pqs[1].half() + pqs[2].half()) / 3.0
                    w_list = [(w * p.half() / avg.half()) for w, p in zip(w_list, pqs)]
                w_all = torch.cat(w_list).half()
                if kind == "int8_sq":
                    sc = w_all.abs().amax(dim=1).float() / 127.0
                    rec = (w_all.float() / sc[:, None]).round().clamp(-128, 127) * sc[:, None]
                    if len(hf) == 1:  # not resmoothed: ModelOpt takes the quantizer amax
                        sc = hf[0]["w_amax"].squeeze().float() / 127.0
                        rec = (w_all.float() / sc[:, None]).round().clamp(-128, 127) * sc[:, None]
                else:
                    blk = hf[0]["block_sizes"][-1]
                    n, k = w_all.shape
                    if len(hf) == 1:
                        sc = hf[0]["w_amax"].float().reshape(n, k // blk) / 7.0
                    else:
                        sc = w_all.reshape(n, k // blk, blk).abs().amax(-1).float() / 7.0
                    rec = (w_all.float() / sc[:, torch.arange(k) // blk]).round().clamp(-8, 7)
                    rec = rec * sc[:, torch.arange(k) // blk]
            entry["max_abs_diff_vs_reconstruction"] = _maxdiff(deq, rec)
            entry["n_other_code_vs_reconstruction"] = _n_other_code(deq, rec)
            # effective weight (what x @ W.T sees) vs the original float16 weight
            orig = torch.cat([base[f"model.layers.{layer}.{h}.weight"] for h in hf_list]).float()
            key = prefix + ".prequant_scaling_factor"
            if tp == 1 and key in ranks[0]:
                eff = deq.float() * ranks[0][key].float()[None, :]
                fq_eff = torch.cat(
                    [e["fake_quant"].float() * e["pre_quant_scale"][None, :] for e in hf]
                )
            else:
                eff, fq_eff = deq.float(), fq.float()
            entry["max_abs_err_effective_export_vs_original"] = _maxdiff(eff, orig)
            entry["max_abs_err_effective_fake_quant_vs_original"] = _maxdiff(fq_eff, orig)
            res[prefix] = entry
    return res


# --------------------------------------------------------------------------- main
def run_export(name, cfg_fn, tp, ids, verify_out):
    export_dir = OUT / name
    if export_dir.exists():
        shutil.rmtree(export_dir)
    model = AutoModelForCausalLM.from_pretrained(HF_DIR, torch_dtype=torch.float16).eval()
    model = mtq.quantize(model, cfg_fn(), forward_loop_factory(ids))
    ref, amax = capture(model)
    with torch.no_grad():
        export_tensorrt_llm_checkpoint(
            model,
            decoder_type="qwen",
            dtype=torch.float16,
            export_dir=export_dir,
            inference_tensor_parallel=tp,
            inference_pipeline_parallel=1,
        )
    (export_dir / "modelopt_amax.json").write_text(
        json.dumps(amax, indent=1, sort_keys=True) + "\n"
    )
    kind = (
        "fp8" if name.startswith("fp8") else ("int4_awq" if name.startswith("int4") else "int8_sq")
    )
    verify_out[name] = verify(name, kind, tp, ref, export_dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify-json", default=None, help="write verification numbers here")
    ap.add_argument("--only", nargs="*", default=None, help="export names to (re)make")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, modelopt {modelopt.__version__}"
    )
    print("stubbed/patched:", STUBBED)
    OUT.mkdir(parents=True, exist_ok=True)
    make_base()
    make_calib()
    ids = load_calib()
    verify_out = {}
    for name, cfg_fn, tp in EXPORTS:
        if args.only and name not in args.only:
            continue
        print(f"=== {name} (tp {tp})")
        run_export(name, cfg_fn, tp, ids, verify_out)
    summary = {
        n: {
            k: max(v[k] for v in r.values())
            for k in (
                "max_abs_diff_vs_fake_quant",
                "n_other_code_vs_fake_quant",
                "max_abs_diff_vs_fake_quant_fp32",
                "n_other_code_vs_fake_quant_fp32",
                "max_abs_diff_vs_reconstruction",
                "max_abs_err_effective_export_vs_original",
                "max_abs_err_effective_fake_quant_vs_original",
            )
        }
        for n, r in verify_out.items()
    }
    print(json.dumps(summary, indent=1))
    if args.verify_json:
        Path(args.verify_json).write_text(json.dumps(verify_out, indent=1) + "\n")


if __name__ == "__main__":
    main()
