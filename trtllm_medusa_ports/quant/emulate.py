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
    fp8_input_value,
    fp8_quantized,
    fp8_requantized,
    fp8_scale,
    fp8_weight,
    fp8_weight_value,
    kv_scale,
    scale_members,
    weight_only_dequantized,
    weight_only_quantized,
)
from trtllm_medusa_ports.quant.calibrate import hf_linears
from trtllm_medusa_ports.quant.tool_formats import (
    AWQ,
    SQ,
    TOOL_ALGOS,
    effective_weight,
    smoothed_input,
)
from trtllm_medusa_ports.weights.sharding import Mapping, Split

#: relative difference allowed between a written scale and the re-derived one (thread counts change the
#: order of float32 sums in the calibration run; a wrong scale is off by far more)
SCALE_RTOL = 1e-3
#: the same for activation / KV scales a tool measured (ModelOpt calibrates with the model in its own dtype and
#: transformers version; on the committed ModelOpt 0.21.1 fixtures our float32 run differs by up to 8e-4): a
#: scale 2x or 4x off still fails by far
TOOL_SCALE_RTOL = 1e-2


@dataclass
class Emulation:
    description: str
    #: written scales that differ from the re-derived ones: (tensor, written, re-derived)
    scale_mismatches: list[tuple[str, float, float]] = field(default_factory=list)
    scales_checked: int = 0
    #: why activation / KV scales were not re-derived (None: they were)
    not_rederived: str | None = None
    handles: list = field(default_factory=list)
    #: the deferred re-derivation of activation / KV scales (apply's ``defer_rederive``)
    pending: object = None

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    def rederive(self) -> None:
        """Run the deferred re-derivation (see :func:`apply`); a no-op when none is pending."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending()


def _where(mapping: Mapping, num_layers: int, i: int) -> tuple[int, int]:
    """(first rank of the stage holding HF layer i, its local index there)."""
    for stage in range(mapping.pp_size):
        layers = list(mapping.layers_of_stage(num_layers, stage))
        if i in layers:
            return mapping.stage_ranks(stage)[0], layers.index(i)
    raise AssertionError(i)


def apply(model: torch.nn.Module, model_dir: str | Path, ckpt, adapter: ArchAdapter, *, rederive: bool = True,
          quiet: bool = True, activations: bool = True, fused: bool = False, gemm: str = "auto",
          defer_rederive: bool = False, calibration: list[list[int]] | None = None,
          layers: set[int] | None = None) -> Emulation:
    """Quantize ``model`` (in place) as the checkpoint is quantized; compare every written scale.

    ``activations=False`` leaves FP8 linears' inputs unquantized and AWQ / SmoothQuant's ``x * pre_quant_scale``
    unrounded (verify's exact checks: those roundings amplify float-order noise between two implementations;
    their effect is reported apart). ``fused``: the
    build fuses FP8 ``mlp.fc`` with ``mlp.gate`` (the executor's ``fused_gate_mlp``); ``gemm``: FP8Linear's GEMM
    path (quant.FP8_GEMM_PATHS). ``defer_rederive``: the activation / KV scales are re-derived (a calibration
    run, which loads the base again) only when :meth:`Emulation.rederive` is called, after the caller has
    freed ``model``: one model in memory at a time. ``calibration``: the samples a tool's checkpoint (no
    ``medusa_ports.calibration`` record) was calibrated on, to re-derive its scales under the tool's rule.
    ``layers``: quantize only these decoder layers (a streamed model, one layer in memory at a time; the
    weight-only formats, whose layers are quantized independently)."""
    cfg = ckpt.config
    spec = QuantSpec.from_config(cfg)
    exclude = (cfg.get("quantization") or {}).get("exclude_modules")
    dtype = to_torch(cfg["dtype"]) if cfg["dtype"] in CHECKPOINT_DTYPES else torch.float32
    hf = HFConfig.read(model_dir)
    modules = dict(model.named_modules())
    linears = [lin for lin in hf_linears(modules, adapter, hf, str(model_dir)) if layers is None or lin.layer in layers]
    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    n_layers = int(cfg["num_hidden_layers"])
    em = Emulation(f"transformers with the checkpoint's quantization ({spec.quant_algo or 'float weights'}"
                   + (f", {spec.kv_cache_quant_algo} KV cache" if spec.kv_cache_quant_algo else "") + ")")

    def written(rank: int, name: str) -> float:
        return float(ckpt.tensor(rank, name).float().reshape(-1)[0])

    def compare(name: str, got: float, want: float, rtol: float = SCALE_RTOL) -> None:
        em.scales_checked += 1
        if abs(got - want) > rtol * max(abs(want), 1e-30):
            em.scale_mismatches.append((name, got, want))

    with torch.no_grad():
        if spec.weight_only:
            _weight_only_linears(modules, linears, mapping, n_layers, exclude, dtype, spec.quant_algo)
        if spec.weight_only and adapter.num_experts(hf) > 1:
            _weight_only_experts(model, adapter, hf, spec, exclude, mapping, cfg, n_layers, dtype, str(model_dir),
                                 layers)
        if spec.quant_algo == "FP8":
            _fp8(em, modules, linears, mapping, n_layers, exclude, dtype, written, compare, activations, fused, gemm)
        if spec.quant_algo in TOOL_ALGOS:
            _tool_format(em, modules, linears, ckpt, mapping, n_layers, dtype, spec.quant_algo, compare, str(model_dir),
                         activations)
    if spec.needs_calibration:
        def pending() -> None:
            em.not_rederived = _rederive(em, model_dir, ckpt, adapter, spec, linears, mapping, n_layers, exclude,
                                         compare, rederive, quiet, calibration)
        if defer_rederive:
            em.pending = pending
        else:
            pending()
    return em


def _weight_only_linears(modules, linears, mapping: Mapping, n_layers: int, exclude, dtype: torch.dtype,
                         algo: str) -> None:
    """Each linear the checkpoint stores weight-only (not excluded) as the engine multiplies by it: quantized per
    output channel, a row-parallel layer per rank's slice of its input."""
    for lin in linears:
        rank, local = _where(mapping, n_layers, lin.layer)
        if not weight_only_quantized(f"transformer.layers.{local}.{lin.short}.weight", exclude):
            continue
        for name in lin.modules:
            w = modules[name].weight
            pieces = mapping.tp_size if lin.split is Split.ROW else 1
            w.copy_(_weight_only_by_slices(w.data, pieces, dtype, algo))


def _fp8(em, modules, linears, mapping, n_layers, exclude, dtype, written, compare, activations, fused, gemm) -> None:
    """FP8 linears: each weight scale re-derived from the transformers weights under the writer's rule and
    compared, the weights cast with it, fused fc/gate moved to their larger scale as the build does, and (with
    ``activations``) each input quantized with the written activation scale (the pair's larger one when fused).

    The writer's rule for ``mlp.fc`` and ``mlp.gate``: one scale for both (this project's converter; ModelOpt's
    ``preprocess_linear_fusion`` where it pre-fuses) or one each (ModelOpt 0.21's ``export_tensorrt_llm_checkpoint``
    of a GatedMLP writes two linears, ``build_mlp_config``). It is read from the written pair: a scale equal to its
    own linear's amax / 448 and not to the pair's is a scale of its own. q, k and v are one tensor with one scale
    in both writers (ModelOpt ``QKVConfig``: the max over the three)."""
    own: dict[tuple[int, str], float] = {}
    for lin in linears:
        own[(lin.layer, lin.short)] = max(float(modules[n].weight.abs().max()) for n in lin.modules)
    chosen: dict[tuple[int, str], float] = {}
    for lin in linears:
        rank, local = _where(mapping, n_layers, lin.layer)
        base = f"transformer.layers.{local}.{lin.short}"
        if not fp8_quantized(base + ".weight", exclude):
            continue
        got = written(rank, base + ".weights_scaling_factor")
        members = [m for m in scale_members(lin.short) if (lin.layer, m) in own]
        shared = fp8_scale(max(own[(lin.layer, m)] for m in members))
        alone = fp8_scale(own[(lin.layer, lin.short)])
        close = lambda a, b: abs(a - b) <= SCALE_RTOL * max(abs(b), 1e-30)  # noqa: E731
        s_w = alone if len(members) > 1 and close(got, alone) and not close(got, shared) else shared
        chosen[(lin.layer, lin.short)] = s_w
        compare(f"rank{rank} {base}.weights_scaling_factor", got, s_w)
    for lin in linears:
        key = (lin.layer, lin.short)
        if key not in chosen:
            continue
        rank, local = _where(mapping, n_layers, lin.layer)
        base = f"transformer.layers.{local}.{lin.short}"
        s_w, pair = chosen[key], None
        if fused and lin.short in ("mlp.fc", "mlp.gate"):
            pair = [m for m in ("mlp.fc", "mlp.gate") if (lin.layer, m) in chosen]
            pair = pair if len(pair) == 2 else None
        s_a = written(rank, base + ".activation_scaling_factor")
        new = s_w
        if pair:
            new = max(chosen[(lin.layer, m)] for m in pair)
            s_a = max(written(rank, f"transformer.layers.{local}.{m}.activation_scaling_factor") for m in pair)
        for name in lin.modules:
            m = modules[name]
            q = fp8_requantized(fp8_weight(m.weight, s_w), s_w, new)
            m.weight.copy_(fp8_weight_value(q, new, dtype, gemm))
            if not activations:
                continue

            def pre(_m, args, s_a=s_a):
                return (fp8_input_value(args[0], s_a, dtype, gemm),) + tuple(args[1:])
            em.handles.append(m.register_forward_pre_hook(pre))


def code_slack(maxq: float, dtype: torch.dtype) -> float:
    """How far from the weight it was quantized from a stored code may land, in steps: half a step is rounding; the
    rest is two roundings to the model dtype the tool makes before quantizing - the weight with the smoothing scale
    folded in, and the written pre-quant scale (its reciprocal) - each half the dtype's epsilon of a weight of up to
    ``maxq`` steps: 0.508 steps for AWQ and 0.64 for SmoothQuant in float16; in bfloat16 0.56 and 1.6 (there it
    cannot tell a SmoothQuant code one step off: parity and the scales still can)."""
    return 0.5 + maxq * float(torch.finfo(dtype).eps) * 1.1


def _tool_format(em, modules, linears, ckpt, mapping, n_layers, dtype, algo, compare, where,
                 activations: bool) -> None:
    """AWQ / SmoothQuant linears as a tool wrote them (quant/tool_formats.py): each stored code checked against the
    transformers weight it stands for (``code * step * pre_quant_scale`` within :data:`CODE_SLACK_STEPS` steps of it,
    element by element: a wrong packing, order or scale fails), each weight-scale tensor re-derived from the
    transformers weights and the written pre-quant scale (AWQ: a group's ``amax / 7``; SmoothQuant: a row's
    ``amax / 127``), and the transformers linears given the weight the engine multiplies with and an input hook
    multiplying by the pre-quant scale as the engine does (rounded to the model dtype, ``smoothed_input``). The AWQ search's own scale (the pre-quant scale) is the tool's
    choice and is taken as written."""
    if mapping.tp_size > 1:
        raise ModelError(f"{algo} written at tp {mapping.tp_size}: verify reads a tool's {algo} export at tp 1 only (its "
                         "codes are checked against the transformers weights, which a tensor-parallel split would need "
                         "undoing for)", where=where,
                         fix="export the same base at tp 1 (inference_tensor_parallel=1) and verify that checkpoint; "
                             "the quantization is the same")
    maxq = 7.0 if algo == AWQ else 127.0
    for lin in linears:
        rank, local = _where(mapping, n_layers, lin.layer)
        base = f"transformer.layers.{local}.{lin.short}"
        if not ckpt.has(rank, base + ".weights_scaling_factor"):
            continue  # left in float by the tool
        tensors = {n: ckpt.tensor(rank, f"{base}.{n}") for n in ("weight", "weights_scaling_factor",
                                                                 "prequant_scaling_factor")}
        w, pqs, steps = effective_weight(algo, tensors, dtype)
        eff = w * pqs.float()[None, :]
        hf_w = torch.cat([modules[n].weight.detach().float() for n in lin.modules], dim=0)
        if hf_w.shape != eff.shape:
            raise ModelError(f"{base}.weight holds {tuple(eff.shape)} values, the transformers weights "
                             f"{', '.join(lin.modules)} {tuple(hf_w.shape)}", where=where,
                             fix="pass the --model_dir the tool quantized")
        off = (eff - hf_w).abs() / (steps * pqs.float()[None, :]).clamp_min(1e-30)
        if float(off.max()) > code_slack(maxq, dtype):
            em.scale_mismatches.append((f"rank{rank} {base}.weight (largest distance of a code from the weight it "
                                        "stands for, in steps; rounding gives at most the re-derived bound)",
                                        float(off.max()), code_slack(maxq, dtype)))
        em.scales_checked += 1
        smoothed = hf_w / pqs.float()[None, :]
        scales = tensors["weights_scaling_factor"].float()
        if algo == AWQ:
            want = smoothed.reshape(smoothed.shape[0], scales.shape[1], -1).abs().amax(-1) / maxq
        else:
            want = smoothed.abs().amax(-1).reshape(scales.shape) / maxq
        rel = (scales - want).abs() / want.clamp_min(1e-30)
        i = int(rel.reshape(-1).argmax())
        compare(f"rank{rank} {base}.weights_scaling_factor (worst of {scales.numel()})",
                float(scales.reshape(-1)[i]), float(want.reshape(-1)[i]), rtol=TOOL_SCALE_RTOL)
        row = 0
        for n in lin.modules:
            m = modules[n]
            rows = m.weight.shape[0]
            m.weight.copy_(w[row:row + rows].to(m.weight.dtype))
            row += rows

            def pre(_m, args, pqs=pqs):
                return ((smoothed_input(args[0].float(), pqs, dtype, rounded=activations).to(args[0].dtype),)
                        + tuple(args[1:]))
            em.handles.append(m.register_forward_pre_hook(pre))


#: the transformers names of MoE expert weights that become ``mlp.fc`` (input: the hidden state) and those that
#: become ``mlp.proj`` (the down-projection, cut over the ranks along its input): transformers 5 stores each
#: layer's experts as 3-D ``experts.gate_up_proj`` / ``experts.down_proj`` ``[experts, out, in]``, 4.x as
#: per-expert linears (Mixtral ``w1``/``w3``/``w2``, Qwen ``gate_proj``/``up_proj``/``down_proj``) or
#: Granite's 3-D ``input_linear`` / ``output_linear``
_EXPERT_FC = {"gate_up_proj", "w1", "w3", "gate_proj", "up_proj", "input_linear"}
_EXPERT_PROJ = {"down_proj", "w2", "output_linear"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _expert_leaves(adapter: ArchAdapter) -> dict[str, tuple[bool, bool]]:
    """Each expert weight's leaf name -> (a down-projection, stored transposed): the common names above, then the
    family's own (``ArchAdapter.expert_weight_leaves``: DBRX's 2-D ``w1`` / ``v1`` / ``w2``, its ``w2`` stored
    ``[experts x inter, hidden]`` and multiplied as ``x @ w2``)."""
    out = {leaf: (False, False) for leaf in _EXPERT_FC} | {leaf: (True, False) for leaf in _EXPERT_PROJ}
    out.update({leaf: (role == "proj", transposed) for leaf, (role, transposed) in adapter.expert_weight_leaves.items()})
    return out


def _layer_index(adapter: ArchAdapter, name: str) -> int | None:
    """The decoder layer a transformers parameter belongs to, by the family's ``layer_prefix`` (DBRX's
    ``transformer.blocks.{i}.``), else by a ``layers.{i}.`` part; None outside the layers."""
    prefix = re.escape(adapter.layer_prefix).replace(re.escape("{i}"), r"(\d+)")
    m = re.search(r"(?:^|\.)" + prefix, name) or _LAYER.search(name)
    return int(m.group(1)) if m else None


def _weight_only_experts(model, adapter, hf, spec, exclude, mapping, cfg, n_layers, dtype, where,
                         layers: set[int] | None = None) -> None:
    """The routed and shared experts' weights as the engine multiplies by them: weight_only_quantize_dict
    quantizes the rank files' 3-D ``mlp.fc`` / ``mlp.proj`` per expert and per output channel (and the shared
    expert's linears as any), so each transformers expert matrix is quantized per row, the down-projections
    per rank's slice of their input (``moe_tp_size`` slices for the routed experts, ``tp_size`` for the
    shared one)."""
    hidden = adapter.hidden_size(hf)
    moe_tp = int((cfg.get("mapping") or {}).get("moe_tp_size") or mapping.tp_size)
    leaves, experts = _expert_leaves(adapter), adapter.num_experts(hf)
    for name, p in model.named_parameters():
        index = _layer_index(adapter, name)
        parts = name.split(".")
        leaf = parts[-2] if parts[-1] == "weight" else parts[-1]
        shared = ".shared_expert." in name
        if index is None or parts[-1] == "bias" or not (shared or ".experts" in name or leaf in ("input_linear",
                                                                                                 "output_linear")):
            continue
        if layers is not None and index not in layers:
            continue
        if leaf not in leaves:
            raise ModelError(f"the expert weight {name} {tuple(p.shape)} is not one weight-only verify emulates",
                             where=where, fix="verify this base unquantized, or on a GPU")
        proj, transposed = leaves[leaf]
        # [..., out, in] as the engine holds it; a transposed 2-D store [experts x in, out] viewed per expert
        w = p.data.view(experts, -1, p.shape[-1]).transpose(-1, -2) if transposed and not shared else p.data
        if (w.shape[-2] if proj else w.shape[-1]) != hidden:
            raise ModelError(f"the expert weight {name} {tuple(p.shape)} is not [..., out, in] with the hidden size "
                             f"{hidden} {'out' if proj else 'in'}", where=where,
                             fix="verify this base unquantized, or on a GPU")
        rank, local = _where(mapping, n_layers, index)
        target = f"transformer.layers.{local}.mlp.{'shared_expert.' if shared else ''}{'proj' if proj else 'fc'}.weight"
        if not weight_only_quantized(target, exclude):
            continue
        pieces = (mapping.tp_size if shared else moe_tp) if proj else 1
        done = _weight_only_by_slices(w, pieces, dtype, spec.quant_algo)
        p.copy_(done.transpose(-1, -2).reshape(p.shape) if transposed and not shared else done)


def _weight_only_by_slices(w: torch.Tensor, pieces: int, dtype: torch.dtype, algo: str) -> torch.Tensor:
    """``w`` (``[..., out, in]``) as the weight-only GEMMs multiply by it when each of ``pieces`` ranks quantizes its
    slice of the input features (row-parallel layers; 1 for the others), rounded to the checkpoint dtype first."""
    return torch.cat([weight_only_dequantized(c.to(dtype), algo) for c in w.chunk(pieces, dim=-1)], dim=-1)


def _recorded_samples(record: dict, model_dir) -> list[list[int]] | str:
    """The samples a conversion's calibration ``record`` ran on, read again as it read them (with the tokenizer the
    text went through), or why they cannot be had: unreadable, changed, or tokenized otherwise now."""
    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.quant.calibrate import (
        read_calibration_samples,
        recorded_chat_mode,
        recorded_tokenizer_dir,
        recorded_tokenizer_matches,
        samples_digest,
    )

    source = record.get("source")
    path = None if source == "packaged prompts" else source
    tok_dir = recorded_tokenizer_dir(record, model_dir)  # the tokenizer the text went through at conversion
    try:
        samples, _ = read_calibration_samples(path, model_dir, size=int(record["samples"]),
                                              max_seq_length=int(record.get("max_seq_length", 10**9)),
                                              tokenizer_dir=tok_dir, chat_template=recorded_chat_mode(record))
    except (PortError, OSError, KeyError, ValueError) as exc:
        return f"its calibration samples cannot be read again ({exc})"
    if samples_digest(samples) != record.get("sha256"):
        other = recorded_tokenizer_matches(record, tok_dir)
        return (f"the calibration samples at {source} were tokenized again with another tokenizer: {other}"
                if other else f"the calibration samples at {source} changed since the conversion")
    return samples


def _rederive(em, model_dir, ckpt, adapter, spec, linears, mapping, n_layers, exclude, compare, rederive,
              quiet, tool_samples=None) -> str | None:
    """Run the calibration again and compare the activation and KV-cache scales.

    This project's checkpoints record their calibration (``medusa_ports.calibration``) and are re-derived from it
    under its rule (KV: the cached K and V, quant/calibrate.py). A tool's checkpoint records none: with the samples
    it was calibrated on (``tool_samples``) it is re-derived under the tool's rule - ModelOpt
    ``get_kv_cache_scaling_factor`` and TensorRT-LLM's own ``int8_kv_cache``: the q, k and v projection outputs'
    amax (ModelOpt floors an FP8 KV scale at 1) - within :data:`TOOL_SCALE_RTOL`."""
    from trtllm_medusa_ports.quant.calibrate import calibrate

    record = (ckpt.config.get("medusa_ports") or {}).get("calibration")
    if not rederive:
        return "not asked (--skip_calibration_check)"
    rtol = SCALE_RTOL
    if record:
        source = record.get("source")
        samples = _recorded_samples(record, model_dir)
        if isinstance(samples, str):  # why they cannot be had again
            return samples
    elif tool_samples:
        samples, source, rtol = tool_samples, "the given calibration samples", TOOL_SCALE_RTOL
    else:
        return ("the checkpoint records no calibration (a tool's checkpoint: pass the samples it was calibrated on, "
                "--calib_dataset)")
    cal = calibrate(model_dir, adapter, ckpt.config["dtype"], samples, source=str(source), quiet=quiet)
    for lin in linears:
        rank, local = _where(mapping, n_layers, lin.layer)
        base = f"transformer.layers.{local}.{lin.short}"
        if spec.quant_algo == "FP8" and fp8_quantized(base + ".weight", exclude):
            members = [s for s in scale_members(lin.short) if (lin.layer, s) in cal.inputs]
            want = fp8_scale(max(cal.inputs[(lin.layer, s)] for s in members or [lin.short]))
            compare(f"rank{rank} {base}.activation_scaling_factor",
                    float(ckpt.tensor(rank, base + ".activation_scaling_factor").float().reshape(-1)[0]), want, rtol)
        if spec.quant_algo == SQ and ckpt.has(rank, base + ".activation_scaling_factor"):
            pqs = ckpt.tensor(rank, base + ".prequant_scaling_factor").float().reshape(-1)
            want = float((cal.input_channels[(lin.layer, lin.short)] * pqs).max()) / 127.0
            compare(f"rank{rank} {base}.activation_scaling_factor",
                    float(ckpt.tensor(rank, base + ".activation_scaling_factor").float().reshape(-1)[0]), want, rtol)
        if spec.kv_cache_quant_algo and lin.short == "attention.qkv":
            name = f"transformer.layers.{local}.attention.kv_cache_scaling_factor"
            amax = cal.kv_cached.get(lin.layer, 0.0) if record else cal.qkv_outputs.get(lin.layer, 0.0)
            want = kv_scale(amax, spec.kv_cache_quant_algo)
            for r in mapping.stage_ranks(mapping.pp_rank(rank)):
                compare(f"rank{r} {name}", _kv_written(ckpt, r, name), want, rtol)
    return None


def _kv_written(ckpt, rank: int, name: str) -> float:
    """The written KV scale; ModelOpt's separate k / v scales are merged as ``preprocess_weights`` merges them
    (``process_kv_scaling_factor``: their max)."""
    if name in ckpt.ranks[rank]:
        return float(ckpt.tensor(rank, name).float().reshape(-1)[0])
    stem = name[: -len("kv_cache_scaling_factor")]
    return max(float(ckpt.tensor(rank, stem + f"{x}_cache_scaling_factor").float().reshape(-1)[0]) for x in "kv")
