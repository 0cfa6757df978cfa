"""The transformers model with a checkpoint's quantization applied, and every written scale re-derived.

``verify`` judges a quantized checkpoint against transformers computing *the same* quantized model, so
parity keeps the float tolerance and a wrong scale shows:

* weight-only: each transformers linear's weight (rounded to the checkpoint dtype) is replaced by what
  ``symmetric_quantize`` makes of it on each rank (per output channel; row-parallel ``dense`` / ``proj``
  per tensor-parallel slice of the input features, as ``preprocess_weights`` quantizes rank files);
* FP8: the weight scales are computed again from the transformers weights (the max over q, k, v and over
  gate, up), the weights cast with them, and each linear's input quantized with the checkpoint's
  activation scale; those activation scales and the KV-cache scales are re-derived by running the
  recorded calibration again when its samples can be read (``medusa_ports.calibration``);
* a quantized KV cache changes no logit of the context phase (the engine's context attention reads its
  own K/V; generation reads the quantized cache): it is proven by the re-derived scales and by greedy
  equivalence of Medusa against the executor's own plain decoding of the quantized model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, to_torch
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.quant import (
    QuantSpec,
    fp8_activation,
    fp8_quantized,
    fp8_scale,
    fp8_weight,
    kv_scale,
    scale_group,
    scale_members,
    weight_only_dequantized,
    weight_only_quantized,
)
from trtllm_medusa_ports.quant.calibrate import hf_linears
from trtllm_medusa_ports.sharding import Mapping, Split

#: relative difference allowed between a written scale and the re-derived one (thread counts change the
#: order of float32 sums in the calibration run; a wrong scale is off by far more)
SCALE_RTOL = 1e-3


@dataclass
class Emulation:
    description: str
    #: written scales that differ from the re-derived ones: (tensor, written, re-derived)
    scale_mismatches: list[tuple[str, float, float]] = field(default_factory=list)
    scales_checked: int = 0
    #: why activation / KV scales were not re-derived (None: they were)
    not_rederived: str | None = None
    handles: list = field(default_factory=list)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _where(mapping: Mapping, num_layers: int, i: int) -> tuple[int, int]:
    """(first rank of the stage holding HF layer i, its local index there)."""
    for stage in range(mapping.pp_size):
        layers = list(mapping.layers_of_stage(num_layers, stage))
        if i in layers:
            return mapping.stage_ranks(stage)[0], layers.index(i)
    raise AssertionError(i)


def apply(model: torch.nn.Module, model_dir: str | Path, ckpt, adapter: ArchAdapter, *, rederive: bool = True,
          quiet: bool = True, activations: bool = True) -> Emulation:
    """Quantize ``model`` (in place) as the checkpoint is quantized; compare every written scale.

    ``activations=False`` leaves FP8 linears' inputs unquantized (verify's exact checks: that rounding
    amplifies float-order noise between two implementations; its effect is reported apart)."""
    cfg = ckpt.config
    spec = QuantSpec.from_config(cfg)
    exclude = (cfg.get("quantization") or {}).get("exclude_modules")
    dtype = to_torch(cfg["dtype"]) if cfg["dtype"] in CHECKPOINT_DTYPES else torch.float32
    hf = HFConfig.read(model_dir)
    modules = dict(model.named_modules())
    linears = hf_linears(modules, adapter, hf, str(model_dir))
    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    n_layers = int(cfg["num_hidden_layers"])
    em = Emulation(f"transformers with the checkpoint's quantization ({spec.quant_algo or 'float weights'}"
                   + (f", {spec.kv_cache_quant_algo} KV cache" if spec.kv_cache_quant_algo else "") + ")")

    def written(rank: int, name: str) -> float:
        return float(ckpt.tensor(rank, name).float().reshape(-1)[0])

    def compare(name: str, got: float, want: float) -> None:
        em.scales_checked += 1
        if abs(got - want) > SCALE_RTOL * max(abs(want), 1e-30):
            em.scale_mismatches.append((name, got, want))

    with torch.no_grad():
        if spec.weight_only:
            for lin in linears:
                rank, local = _where(mapping, n_layers, lin.layer)
                if not weight_only_quantized(f"transformer.layers.{local}.{lin.short}.weight", exclude):
                    continue
                for name in lin.modules:
                    w = modules[name].weight
                    pieces = mapping.tp_size if lin.split is Split.ROW else 1
                    w.copy_(_weight_only_by_slices(w.data, pieces, dtype, spec.quant_algo))
        if spec.weight_only and adapter.num_experts(hf) > 1:
            _weight_only_experts(model, adapter, hf, spec, exclude, mapping, cfg, n_layers, dtype, str(model_dir))
        if spec.quant_algo == "FP8":
            amax: dict[tuple[int, str], float] = {}
            for lin in linears:
                key = (lin.layer, scale_group(lin.short))
                for name in lin.modules:
                    amax[key] = max(amax.get(key, 0.0), float(modules[name].weight.abs().max()))
            for lin in linears:
                rank, local = _where(mapping, n_layers, lin.layer)
                base = f"transformer.layers.{local}.{lin.short}"
                if not fp8_quantized(base + ".weight", exclude):
                    continue
                s_w = fp8_scale(amax[(lin.layer, scale_group(lin.short))])
                compare(f"rank{rank} {base}.weights_scaling_factor", written(rank, base + ".weights_scaling_factor"),
                        s_w)
                s_a = written(rank, base + ".activation_scaling_factor")
                for name in lin.modules:
                    m = modules[name]
                    m.weight.copy_(fp8_weight(m.weight, s_w).float() * s_w)
                    if not activations:
                        continue

                    def pre(_m, args, s_a=s_a):
                        return (fp8_activation(args[0], s_a, dtype) * s_a,) + tuple(args[1:])
                    em.handles.append(m.register_forward_pre_hook(pre))
    if spec.needs_calibration:
        em.not_rederived = _rederive(em, model_dir, ckpt, adapter, spec, linears, mapping, n_layers, exclude,
                                     compare, rederive, quiet)
    return em


#: the transformers names of MoE expert weights that become ``mlp.fc`` (input: the hidden state) and those that
#: become ``mlp.proj`` (the down-projection, cut over the ranks along its input): transformers 5 stores each
#: layer's experts as 3-D ``experts.gate_up_proj`` / ``experts.down_proj`` ``[experts, out, in]``, 4.x as
#: per-expert linears (Mixtral ``w1``/``w3``/``w2``, Qwen ``gate_proj``/``up_proj``/``down_proj``) or
#: Granite's 3-D ``input_linear`` / ``output_linear``
_EXPERT_FC = {"gate_up_proj", "w1", "w3", "gate_proj", "up_proj", "input_linear"}
_EXPERT_PROJ = {"down_proj", "w2", "output_linear"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _weight_only_experts(model, adapter, hf, spec, exclude, mapping, cfg, n_layers, dtype, where) -> None:
    """The routed and shared experts' weights as the engine multiplies by them: weight_only_quantize_dict
    quantizes the rank files' 3-D ``mlp.fc`` / ``mlp.proj`` per expert and per output channel (and the shared
    expert's linears as any), so each transformers expert matrix is quantized per row, the down-projections
    per rank's slice of their input (``moe_tp_size`` slices for the routed experts, ``tp_size`` for the
    shared one)."""
    hidden = adapter.hidden_size(hf)
    moe_tp = int((cfg.get("mapping") or {}).get("moe_tp_size") or mapping.tp_size)
    for name, p in model.named_parameters():
        m = _LAYER.search(name)
        parts = name.split(".")
        leaf = parts[-2] if parts[-1] == "weight" else parts[-1]
        shared = ".shared_expert." in name
        if m is None or parts[-1] == "bias" or not (shared or ".experts" in name or leaf in ("input_linear",
                                                                                              "output_linear")):
            continue
        if leaf not in _EXPERT_FC | _EXPERT_PROJ:
            raise ModelError(f"the expert weight {name} {tuple(p.shape)} is not one weight-only verify emulates",
                             where=where, fix="verify this base unquantized, or on a GPU")
        proj = leaf in _EXPERT_PROJ
        if (p.shape[-2] if proj else p.shape[-1]) != hidden:
            raise ModelError(f"the expert weight {name} {tuple(p.shape)} is not [..., out, in] with the hidden size "
                             f"{hidden} {'out' if proj else 'in'}", where=where,
                             fix="verify this base unquantized, or on a GPU")
        rank, local = _where(mapping, n_layers, int(m.group(1)))
        target = f"transformer.layers.{local}.mlp.{'shared_expert.' if shared else ''}{'proj' if proj else 'fc'}.weight"
        if not weight_only_quantized(target, exclude):
            continue
        pieces = (mapping.tp_size if shared else moe_tp) if proj else 1
        p.copy_(_weight_only_by_slices(p.data, pieces, dtype, spec.quant_algo))


def _weight_only_by_slices(w: torch.Tensor, pieces: int, dtype: torch.dtype, algo: str) -> torch.Tensor:
    """``w`` (``[..., out, in]``) as the weight-only GEMMs multiply by it when each of ``pieces`` ranks quantizes its
    slice of the input features (row-parallel layers; 1 for the others), rounded to the checkpoint dtype first."""
    return torch.cat([weight_only_dequantized(c.to(dtype), algo) for c in w.chunk(pieces, dim=-1)], dim=-1)


def _rederive(em, model_dir, ckpt, adapter, spec, linears, mapping, n_layers, exclude, compare, rederive,
              quiet) -> str | None:
    """Run the recorded calibration again and compare the activation and KV-cache scales."""
    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.quant.calibrate import (
        calibrate,
        read_calibration_samples,
        samples_digest,
    )

    record = (ckpt.config.get("medusa_ports") or {}).get("calibration")
    if not rederive:
        return "not asked (--skip_calibration_check)"
    if not record:
        return "the checkpoint records no calibration"
    source = record.get("source")
    path = None if source == "packaged prompts" else source
    try:
        samples, _ = read_calibration_samples(path, model_dir, size=int(record["samples"]),
                                              max_seq_length=int(record.get("max_seq_length", 10**9)))
    except (PortError, OSError, KeyError, ValueError) as exc:
        return f"its calibration samples cannot be read again ({exc})"
    if samples_digest(samples) != record.get("sha256"):
        return f"the calibration samples at {source} changed since the conversion"
    cal = calibrate(model_dir, adapter, ckpt.config["dtype"], samples, source=str(source), quiet=quiet)
    for lin in linears:
        rank, local = _where(mapping, n_layers, lin.layer)
        base = f"transformer.layers.{local}.{lin.short}"
        if spec.quant_algo == "FP8" and fp8_quantized(base + ".weight", exclude):
            members = [s for s in scale_members(lin.short) if (lin.layer, s) in cal.inputs]
            want = fp8_scale(max(cal.inputs[(lin.layer, s)] for s in members or [lin.short]))
            compare(f"rank{rank} {base}.activation_scaling_factor",
                    float(ckpt.tensor(rank, base + ".activation_scaling_factor").float().reshape(-1)[0]), want)
        if spec.kv_cache_quant_algo and lin.short == "attention.qkv":
            name = f"transformer.layers.{local}.attention.kv_cache_scaling_factor"
            want = kv_scale(cal.qkv_outputs.get(lin.layer, 0.0), spec.kv_cache_quant_algo)
            for r in mapping.stage_ranks(mapping.pp_rank(rank)):
                compare(f"rank{r} {name}", float(ckpt.tensor(r, name).float().reshape(-1)[0]), want)
    return None
