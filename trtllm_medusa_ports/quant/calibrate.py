"""Max calibration of a base: the largest |input| of every linear TensorRT-LLM quantizes and the largest
|K| and |V| each layer's KV cache holds, measured on the transformers model in float32 on weights rounded
to the checkpoint dtype (what the checkpoint computes with), over the calibration samples once.

ModelOpt's max calibration (``modelopt/torch/quantization/calib/max.py`` ``MaxCalibrator``) keeps the
running max of |x| per quantizer. The KV-cache scale is measured on what the cache holds: the attention
kernel quantizes K after the q/k norms (``layers/attention.py`` applies ``q_layernorm`` / ``k_layernorm``
before ``gpt_attention``) and after RoPE (``applyBiasRopeUpdateKVCacheV2`` rotates, then stores), and V as
projected, with one scale for both. TensorRT-LLM's own INT8 converter and ModelOpt 0.21 take the q, k, v
projection outputs instead (``tensorrt_llm/models/llama/convert.py`` ``capture_activation_range``; ModelOpt
``get_kv_cache_scaling_factor``), which for a q/k-norm family (Qwen3, Gemma 3) says nothing about the cached
range: Gemma 3's normalised K overflowed such a scale 8.8x. transformers hands the cache exactly that K and V
(``Cache.update`` is called after the norms and RoPE), so that is where it is read. HF modules are
found from the family's weight table: each checkpoint linear's source tensors name the HF modules whose
input it takes (q/k/v all read one input, as do gate and up), so no family needs calibration code.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.weights import layer_sources
from trtllm_medusa_ports.errors import ModelError, PortError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.files.prompts import check_ids
from trtllm_medusa_ports.quant import linear_of
from trtllm_medusa_ports.sharding import Split

#: upstream's defaults (examples/quantization/quantize.py --calib_size 512 --calib_max_seq_length 512)
DEFAULT_CALIB_SIZE = 512
DEFAULT_CALIB_MAX_SEQ_LENGTH = 512


@dataclass
class Calibration:
    """Ranges by HF layer index and checkpoint linear name (``attention.qkv``, ``mlp.fc``, ...)."""

    inputs: dict[tuple[int, str], float] = field(default_factory=dict)
    #: largest |q, k, v projection output| per layer (upstream's INT8 KV convention; kept for comparison)
    qkv_outputs: dict[int, float] = field(default_factory=dict)
    #: largest |K| (after q/k norms and RoPE) and |V| the layer's KV cache holds: the KV scale's amax
    kv_cached: dict[int, float] = field(default_factory=dict)
    #: per input channel, the largest |input| of each linear (SmoothQuant's smoothed activation range is
    #: ``max_c amax_c * pre_quant_scale_c``); not kept by :meth:`to_json`
    input_channels: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    source: str = ""
    digest: str = ""

    def to_json(self) -> str:
        """The whole calibration as JSON (:meth:`from_json` reads it back): calibrate once, convert elsewhere."""
        d = {"inputs": [[i, name, v] for (i, name), v in sorted(self.inputs.items())],
             "qkv_outputs": [[i, v] for i, v in sorted(self.qkv_outputs.items())],
             "kv_cached": [[i, v] for i, v in sorted(self.kv_cached.items())],
             **{k: getattr(self, k) for k in ("samples", "tokens", "seconds", "source", "digest")}}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        return cls(inputs={(int(i), str(n)): float(v) for i, n, v in d["inputs"]},
                   qkv_outputs={int(i): float(v) for i, v in d["qkv_outputs"]},
                   kv_cached={int(i): float(v) for i, v in d.get("kv_cached", [])},
                   **{k: d[k] for k in ("samples", "tokens", "seconds", "source", "digest")})

    def record(self) -> dict:
        """What config.json keeps of it (``medusa_ports.calibration``): enough for ``verify`` to redo it."""
        return {"source": self.source, "samples": self.samples, "tokens": self.tokens, "sha256": self.digest,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class HFLinear:
    layer: int  # HF layer index
    short: str  # checkpoint linear within the layer: attention.qkv, mlp.fc, ...
    split: Split
    modules: tuple[str, ...]  # the transformers modules whose weights it is made of


def hf_linears(modules: dict[str, torch.nn.Module], adapter: ArchAdapter, hf: HFConfig, where: str) -> list[HFLinear]:
    """Every checkpoint linear TensorRT-LLM may quantize, with the transformers modules it comes from (the
    family's weight table: a linear's source tensors name them; used by calibration and by verify)."""
    out = []
    for i in range(adapter.num_hf_layers(hf)):
        for rule in layer_sources(adapter.layer_rules(hf), i):
            lin = linear_of(f"transformer.layers.{i}.{rule.name}")
            if rule.experts:  # stacked MoE experts: weight-only needs no calibration, FP8 ones are refused (port-limit)
                continue
            if lin is None or f"transformer.layers.{i}.{rule.name}" != lin + ".weight":
                continue
            names = next((c for c in rule.candidates() if all(n[: -len(".weight")] in modules for n in c)), None)
            if names is None:
                raise ModelError(f"no transformers module holds {', '.join(rule.sources)} (layer {i})", where=where,
                                 fix="the base's modelling code differs from its family's")
            out.append(HFLinear(i, rule.name[: -len(".weight")], rule.split,
                                tuple(n[: -len(".weight")] for n in names)))
    return out


def samples_digest(samples: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()


def read_calibration_samples(path: str | Path | None, model_dir: str | Path, *, size: int | None, max_seq_length: int,
                             tokenizer_dir: str | Path | None = None) -> tuple[list[list[int]], str]:
    """The calibration samples (token ids, one per line or prompt, cut at ``max_seq_length``) and their source.

    ``path`` (``--calib_dataset``): text lines (one sample each, ``\\n`` for a line break), read as
    ``--prompts_file``, or JSON lines with ``text``, ``prompt``, ``input_ids`` or ``prompt_ids``, read as
    ``--data`` (ids used as they are, no token added; files/prompts.py); None: the packaged prompts.
    Fewer samples than ``size`` is an error, never a silent smaller calibration; ``size`` None: every sample.
    """
    from trtllm_medusa_ports.files.prompts import (
        PromptInputs,
        lazy_tokenizer,
        looks_like_json_lines,
        packaged_prompts,
        read_items,
    )

    if (size is not None and size < 1) or max_seq_length < 1:
        raise PortError(f"--calib_size {size} and --calib_max_seq_length {max_seq_length} must be at least 1",
                        fix="e.g. --calib_size 512 --calib_max_seq_length 512 (upstream's defaults)")
    tokenize = lazy_tokenizer(tokenizer_dir or model_dir)
    if path is None:
        source = "packaged prompts"
        items = read_items(PromptInputs(), tokenize, default=lambda: packaged_prompts()[:size] if size else packaged_prompts())
    else:
        source = str(Path(path).resolve())
        p = Path(path)
        if not p.is_file():
            hub = not p.exists() and "/" in str(path) and not str(path).startswith((".", "/"))
            raise PortError("the calibration dataset is not a regular file"
                            + (" (a dataset name like upstream's ccdv/cnn_dailymail is not fetched: no hub access)"
                               if hub else ""), where=str(p),
                            fix="pass a text file (one sample per line) or JSON lines with text / input_ids"
                                + ("; omit --calib_dataset for the packaged prompts" if hub else ""))
        inputs = PromptInputs(data=p) if looks_like_json_lines(p) else PromptInputs(prompts_file=p)
        items = read_items(inputs, tokenize)
    samples = [it.ids for it in items if it.ids]
    size = len(samples) if size is None else size
    if len(samples) < size:
        raise PortError(f"the calibration set has {len(samples)} non-empty sample(s), --calib_size asks for {size}",
                        where=source, fix=f"pass --calib_size {len(samples)} or a larger --calib_dataset")
    return [ids[:max_seq_length] for ids in samples[:size]], source


def calibrate(model_dir: str | Path, adapter: ArchAdapter, dtype: str, samples: list[list[int]], *,
              source: str = "", device: str = "cpu", quiet: bool = True) -> Calibration:
    """Run the base once over ``samples`` and keep the ranges (see the module doc)."""
    from tqdm import tqdm

    from trtllm_medusa_ports.base_model import load_hf_model, value_transforms
    from trtllm_medusa_ports.files.dtypes import to_torch

    hf = HFConfig.read(model_dir)
    vocab = int(hf.require("vocab_size"))
    # before the model is loaded: a bad sample costs nothing
    check_ids(samples, vocab, "calibration sample", where=source, fix="tokenize with the base's own tokenizer")
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    model = load_hf_model(model_dir, to_torch(dtype), value_transforms(model_dir, hf.architecture),
                          full_precision=adapter.full_precision_parameters)
    if device != "cpu":
        try:
            model = model.to(device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise PortError(f"--device {device}: {exc}", fix="use --device cpu or a device torch can reach") from None
    modules = dict(model.named_modules())
    cal = Calibration(source=source, digest=samples_digest(samples), samples=len(samples),
                      tokens=sum(len(s) for s in samples))

    def keep(store: dict, key, value: float) -> None:
        store[key] = max(store.get(key, 0.0), value)

    handles = []
    for lin in hf_linears(modules, adapter, hf, str(model_dir)):
        for name in lin.modules:
            def hook(_m, args, out, i=lin.layer, short=lin.short):
                keep(cal.inputs, (i, short), float(args[0].detach().abs().max()))
                chans = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float().cpu()
                prev = cal.input_channels.get((i, short))
                cal.input_channels[(i, short)] = chans if prev is None else torch.maximum(prev, chans)
                if short == "attention.qkv":
                    keep(cal.qkv_outputs, i, float(out.detach().abs().max()))
            handles.append(modules[name].register_forward_hook(hook))
    t0 = time.monotonic()
    try:
        with torch.no_grad(), _cached_kv(cal.kv_cached):
            for ids in tqdm(samples, desc="calibrate", unit="sample", disable=quiet):
                model(input_ids=torch.tensor([ids], device=next(model.parameters()).device), use_cache=True)
    finally:
        for h in handles:
            h.remove()
    cal.seconds = time.monotonic() - t0
    return cal


@contextmanager
def _cached_kv(store: dict[int, float]):
    """Record, per layer, the largest |K| and |V| transformers hands its KV cache (``Cache.update``, called with
    the keys after the q/k norms and RoPE) while the block runs."""
    from transformers.cache_utils import Cache

    update = Cache.update

    def recording(self, key_states, value_states, layer_idx, *args, **kwargs):
        amax = max(float(key_states.detach().abs().max()), float(value_states.detach().abs().max()))
        store[int(layer_idx)] = max(store.get(int(layer_idx), 0.0), amax)
        return update(self, key_states, value_states, layer_idx, *args, **kwargs)

    Cache.update = recording
    try:
        yield
    finally:
        Cache.update = update
