"""A torch executor of a TensorRT-LLM checkpoint, on CPU, with TensorRT-LLM's semantics.

It reads only what the converter wrote (config.json + rank files) and computes
the way the engine would:

* tensor parallelism is simulated rank by rank: each rank uses its own shard,
  row-parallel outputs are summed (all-reduce) before their bias, column-parallel
  outputs that the engine gathers (lm_head, Medusa heads) are concatenated, and
  the vocabulary padding is cut off after the gather; a wrong split changes the
  result;
* pipeline stages run in sequence, each with its own (renumbered) layers;
* the generation step takes TensorRT-LLM's spec-decoding inputs as they are:
  ``spec_decoding_position_offsets`` (position = past length + offset) and
  ``spec_decoding_packed_mask`` (int32 words decoded bit by bit); tree tokens see
  the whole past plus the tree tokens their mask row allows;
* Medusa heads run on the final-norm hidden states: ``x + act(x W^T + b)`` per
  layer, then their own lm_head or the base's (``medusa_shared_lm_head``).

Family differences come from the adapter's :class:`Semantics` (archs/), which it
derives from config.json - not from a copy of the Hugging Face modelling code.
Everything computes in float32 on the checkpoint's (possibly rounded) weights.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import adapter_for
from trtllm_medusa_ports.archs.semantics import (
    AlibiStyle,
    MlpKind,
    NormKind,
    PositionEmbedding,
    Semantics,
)
from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.files.checkpoint import Checkpoint, read_checkpoint
from trtllm_medusa_ports.files.checkpoint_schema import longrope_problems
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, to_torch
from trtllm_medusa_ports.quant import (
    EMULATED,
    FP8_GEMM_PATHS,
    FUSED_MLP_ACTIVATIONS,
    QuantSpec,
    fp8_input_value,
    fp8_quantized,
    fp8_requantized,
    fp8_weight_value,
    kv_quantized,
    weight_only_dequantized,
    weight_only_quantized,
)
from trtllm_medusa_ports.quant.tool_formats import (
    SQ,
    TOOL_ALGOS,
    effective_weight,
    smoothed_input,
    sq_activation,
)
from trtllm_medusa_ports.reference.load_checks import check_loaded
from trtllm_medusa_ports.reference.rope import (
    global_rope,
    longrope_inv_freq,
    longrope_mscale,
    rope_inv_freq,
)
from trtllm_medusa_ports.reference.routing import route
from trtllm_medusa_ports.trees.tree import unpack_mask
from trtllm_medusa_ports.weights.sharding import Mapping, kv_heads_per_rank


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


#: TensorRT-LLM's activations. Every GELU name is the tanh approximation there
#: (tensorrt_llm/functional.py ``gelu``: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))),
#: including plain "gelu", which Hugging Face computes exactly (erf).
_ACTS = {
    "silu": F.silu,
    "swiglu": F.silu,
    "gelu": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    # squared ReLU (Nemotron): ACT2FN maps both names to squared_relu, relu(x) ** 2 (tensorrt_llm/functional.py)
    "squared-relu": lambda x: F.relu(x).square(),
    "relu2": lambda x: F.relu(x).square(),
}


#: the tensors :class:`ReferenceModel` keeps together when streaming: a decoder layer's, a Medusa head's
_GROUP = re.compile(r"(transformer\.layers\.\d+|medusa_heads\.\d+)\.")


def streaming_group(name: str) -> str:
    """The streaming group of a checkpoint tensor: its decoder layer or Medusa head, else its module (the
    name without its last part: ``transformer.ln_f``, ``lm_head``, ``transformer.vocab_embedding``)."""
    m = _GROUP.match(name)
    return m.group(1) if m else name.rsplit(".", 1)[0]


def activation(name: str):
    try:
        return _ACTS[name]
    except KeyError:
        raise CheckpointError(
            f"activation {name!r} is not implemented by the reference executor",
            fix="add it to reference/executor.py _ACTS",
        ) from None


@dataclass
class LayerCache:
    """KV cache of one layer: per rank ``[kv_heads_local, S, head_size]`` tensors."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]


@dataclass
class KVCache:
    layers: list[LayerCache] = field(default_factory=list)
    positions: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    #: the request's prompt length (the tokens of its context steps): long_rope's generation steps compare it
    context_length: int = 0

    @property
    def length(self) -> int:
        return int(self.positions.shape[0])

    def keep(self, start: int, slots: list[int]) -> None:
        """Keep entries ``[:start]`` and then ``start + s`` for s in ``slots``, compacted.

        This is TensorRT-LLM's ``update_kv_cache_draft_token_location``: accepted
        tree tokens move right behind the root, the rest is rewound.
        """
        idx = torch.tensor(list(range(start)) + [start + s for s in slots], dtype=torch.long)
        self.positions = self.positions[idx]
        for layer in self.layers:
            layer.k = [t[:, idx] for t in layer.k]
            layer.v = [t[:, idx] for t in layer.v]


def _require_emulated(quant_algo: str | None, path: Path) -> None:
    """A quantization the executor computes as the engine does, or the checkpoint refused by name."""
    if quant_algo not in EMULATED:
        raise CheckpointError(
            f"quant_algo {quant_algo} is not emulated by the reference executor (it computes "
            f"{', '.join(a for a in EMULATED if a)}; AWQ, GPTQ and SmoothQuant need their kernels)",
            where=str(path / "config.json"),
            fix="verify such a port on a GPU (scripts/validate_on_gpu.sh), or verify the same base in FP8 or "
                "weight-only here")


class ReferenceModel:
    """Run a TensorRT-LLM checkpoint with torch. ``forward`` appends to a :class:`KVCache`.

    Memory: each rank's weights are held once, in float32 (the embedding table in the checkpoint's
    dtype: it is only indexed). Column-parallel outputs are gathered as the engine gathers them - each
    rank multiplies by its own shard and the outputs are concatenated - so no gathered copy of a weight
    is ever made. ``streaming=True`` keeps only the tensors of the group in use - one rank's tensors of one
    decoder layer, of one Medusa head, or of one other module (embedding, final norm, lm_head) - and reads
    the next group's from the rank files when the computation reaches it: peak memory is one layer's shard
    in float32 whatever the model's size; every forward pass reads the checkpoint once. The values
    are the same either way (the same read and conversion, only what is kept differs). ``device``: where
    the weights are put and the computation runs (factory calls follow ``torch.device`` scopes).
    """

    def __init__(self, checkpoint: Checkpoint | str | Path, *, streaming: bool = False, device: str = "cpu"):
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
        self.ckpt = ckpt
        cfg = ckpt.config
        self.config = cfg
        arch = cfg.get("base_architecture")
        adapter = adapter_for(arch) if arch else None
        if adapter is None:
            raise CheckpointError(
                f"config.json names base_architecture {arch!r}, which has no adapter",
                where=str(ckpt.path / "config.json"),
                fix="only checkpoints written by trtllm-medusa convert can be executed",
            )
        self.adapter: ArchAdapter = adapter
        self.semantics: Semantics = adapter.semantics(cfg)
        self.engine_draft_tokens = int(cfg.get("max_draft_len") or 0)  # every Medusa generation step carries them
        self.mapping = Mapping.from_config(cfg)
        self._stage_ranks: dict[int, list[int]] = {}
        self.tp = ckpt.tp_size
        self.pp = ckpt.pp_size
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_attention_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads") or self.num_attention_heads)
        self.hidden_size = int(cfg["hidden_size"])
        self.head_size = int(cfg.get("head_size") or self.hidden_size // self.num_attention_heads)
        self.vocab = int(cfg["vocab_size"])
        self.local_attention_heads = self.num_attention_heads // self.tp
        self.local_kv_heads = kv_heads_per_rank(self.num_kv_heads, self.tp)
        self._weights: dict[tuple[int, str], torch.Tensor] = {}
        self._stored: dict[tuple[int, str], torch.Tensor] = {}
        self.streaming = streaming
        self.device = torch.device(device)
        self._group: tuple[int, str] | None = None  # streaming: the (rank, group) whose tensors are kept
        #: streaming: how many times a group's tensors were read (a measure of the re-reading it costs)
        self.group_loads = 0
        semantics = self.semantics
        self._positions()
        self.act = activation(semantics.hidden_act)
        self.medusa_act = activation(cfg.get("medusa_hidden_act", "silu"))
        self.num_medusa_heads = int(cfg.get("num_medusa_heads", 0))
        self.num_medusa_layers = int(cfg.get("num_medusa_layers", 0))
        # quantization as the engine computes it (trtllm_medusa_ports/quant): weight-only weights are
        # quantized per rank as preprocess_weights does at load; FP8 linears quantize their input with the
        # written activation scale; a quantized KV cache holds q(k), q(v)
        self.quant = QuantSpec.from_config(cfg)
        #: the rounding steps that amplify float noise: FP8Linear's input quantization and the quantized KV
        #: cache (a 1e-7 difference can flip a rounding); verify turns them off for its exact checks
        self.quantize_activations = True
        self.quantize_kv = True
        _require_emulated(self.quant.quant_algo, ckpt.path)
        self.exclude = (cfg.get("quantization") or {}).get("exclude_modules")
        self.dtype = to_torch(cfg["dtype"]) if cfg.get("dtype") in CHECKPOINT_DTYPES else torch.float32
        #: FP8: which GEMM path of FP8Linear to compute (quant.FP8_GEMM_PATHS; the build's --gemm_plugin), and
        #: whether trtllm-build fuses mlp.fc with mlp.gate (fuse_gate_mlp: GatedMLP, silu or gelu, on by
        #: default), which moves both to the larger weight scale and to the larger activation scale
        self.fp8_gemm = "auto"
        self.fused_gate_mlp = (semantics.mlp is MlpKind.GATED and cfg.get("hidden_act") in FUSED_MLP_ACTIVATIONS)
        #: where set (a list), each MoE layer call appends (tokens, distinct experts chosen): verify's count
        self.moe_activity: list[tuple[int, int]] | None = None
        check_loaded(self)

    def _positions(self) -> None:
        """The position scheme's tables: RoPE's inverse frequencies (global and local bases), or ALiBi's slopes;
        a scheme the executor does not run is refused."""
        semantics = self.semantics
        if semantics.position_embedding not in (PositionEmbedding.ROPE_GPT_NEOX, PositionEmbedding.ROPE_GPTJ,
                                                PositionEmbedding.LONG_ROPE, PositionEmbedding.ALIBI,
                                                PositionEmbedding.LEARNED_ABSOLUTE):
            raise CheckpointError(
                f"position_embedding_type {semantics.position_embedding.value!r} is not implemented by the "
                "reference executor (it runs rope_gpt_neox, rope_gptj, long_rope, alibi and learned_absolute)",
                where=str(self.ckpt.path / "config.json"),
                fix="verification of this variant needs a GPU run (scripts/validate_on_gpu.sh)",
            )
        self.rotary_dim = semantics.rotary_dim or self.head_size
        self._mscale = {False: 1.0}  # long_rope: cos and sin times its table's factor
        if semantics.position_embedding is PositionEmbedding.LONG_ROPE:
            self._long_rope()
        elif semantics.position_embedding.is_rope:
            self.inv_freq, self._mscale[False] = global_rope(self.rotary_dim, semantics)
            if semantics.local_rotary_base is not None:
                self.local_inv_freq = rope_inv_freq(self.rotary_dim, semantics.local_rotary_base,
                                                    semantics.local_rotary_scaling)
        self._slopes = self.alibi_slopes() if semantics.position_embedding is PositionEmbedding.ALIBI else None

    def _long_rope(self) -> None:
        """long_rope's two tables as the engine builds them (archs/semantics.py ``LongRope``); the short one is
        ``inv_freq``, the one every request within ``original_max_position_embeddings`` runs on."""
        lr = self.semantics.longrope
        where = str(self.ckpt.path / "config.json")
        if lr is None:  # read_checkpoint names these first (files/checkpoint_schema.py longrope_problems)
            raise CheckpointError("position_embedding_type is long_rope, but its tables cannot be built: "
                                  + "; ".join(longrope_problems(self.config)), where=where, fix="convert the base again")
        self.inv_freq = longrope_inv_freq(self.rotary_dim, self.semantics.rotary_base, lr.short_factors)
        self.long_inv_freq = longrope_inv_freq(self.rotary_dim, self.semantics.rotary_base, lr.long_factors)
        derived = longrope_mscale(int(self.config["max_position_embeddings"]), lr.original_max_positions)
        self._mscale = {False: derived if lr.short_mscale is None else lr.short_mscale,
                        True: derived if lr.long_mscale is None else lr.long_mscale}

    def long_table(self, cache: KVCache, computed_tokens: int | None = None) -> bool:
        """Whether a step of ``cache``'s request runs on long_rope's long table, as the engine picks per phase
        (archs/semantics.py ``LongRope``): a context step by the tokens it computes (``computed_tokens``), a
        generation step (``computed_tokens`` None) by the prompt plus the engine's max draft length
        (``engine_draft_tokens``: the checkpoint's max_draft_len, which every generation step carries)."""
        lr = self.semantics.longrope
        if lr is None:
            return False
        if computed_tokens is not None:
            return lr.context_long(computed_tokens)
        return lr.generation_long(cache.context_length, self.engine_draft_tokens)

    # -- tensors ---------------------------------------------------------------------
    def stage_ranks(self, pp_rank: int) -> list[int]:
        ranks = self._stage_ranks.get(pp_rank)
        if ranks is None:  # asked for every layer and linear: made once per stage
            ranks = self._stage_ranks[pp_rank] = self.mapping.stage_ranks(pp_rank)
        return ranks

    def _kept(self, cache: dict, rank: int, name: str) -> bool:
        """Whether ``(rank, name)`` is in ``cache``; streaming, a tensor of another group than the kept one first
        drops every kept tensor (see the class doc)."""
        if self.streaming:
            group = (rank, streaming_group(name))
            if group != self._group:
                self._weights.clear()
                self._stored.clear()
                self._group = group
                self.group_loads += 1
        return (rank, name) in cache

    def weight(self, rank: int, name: str) -> torch.Tensor:
        """Tensor ``name`` of ``rank`` in float32, read once and kept (streaming: while its group is in use)."""
        key = (rank, name)
        if not self._kept(self._weights, rank, name):
            if self.device.type == "cpu":
                self._weights[key] = self._float32(rank, name)
            else:
                with torch.device("cpu"):  # the rank files' tensors: converted on the CPU whatever the device
                    self._weights[key] = self._float32(rank, name).to(self.device)
        return self._weights[key]

    def _float32(self, rank: int, name: str) -> torch.Tensor:
        """Tensor ``name`` of ``rank`` as the engine multiplies by it, in float32 (dequantized where stored
        quantized)."""
        t = self.ckpt.tensor(rank, name)
        if self.quant.quant_algo in TOOL_ALGOS and t.dtype == torch.int8:
            linear = name[: -len(".weight")]
            t, _, _ = effective_weight(self.quant.quant_algo, self.tool_tensors(rank, linear), self.dtype)
        elif self.quant.weight_only and weight_only_quantized(name, self.exclude):
            t = weight_only_dequantized(t, self.quant.quant_algo)
        elif t.dtype == torch.float8_e4m3fn:
            t = self._fp8_weight(rank, name, t)
        return t.float()

    def tool_tensors(self, rank: int, linear: str) -> dict[str, torch.Tensor]:
        """A tool-quantized linear's tensors (quant/tool_formats.py), by their short names."""
        names = ("weight", "weights_scaling_factor", "prequant_scaling_factor", "activation_scaling_factor")
        return {n: self.ckpt.tensor(rank, f"{linear}.{n}") for n in names if self.has(rank, f"{linear}.{n}")}

    def _scalar(self, rank: int, name: str) -> float:
        return float(self.ckpt.tensor(rank, name).float().reshape(-1)[0])

    def fused_pair(self, linear: str) -> tuple[str, str] | None:
        """``(fc, gate)`` when ``linear`` is one of the two FP8 linears fuse_gate_mlp fuses, else None."""
        if self.quant.quant_algo != "FP8" or not self.fused_gate_mlp or not linear.endswith((".mlp.fc", ".mlp.gate")):
            return None
        head = linear.rsplit(".", 1)[0]
        if not head.startswith("transformer.layers.") or head.count(".") != 3:
            return None
        pair = (head + ".fc", head + ".gate")
        return pair if all(fp8_quantized(n + ".weight", self.exclude) for n in pair) else None

    def _fp8_weight(self, rank: int, name: str, q: torch.Tensor) -> torch.Tensor:
        """An FP8 weight as the engine multiplies with it: fused fc/gate moved to their larger scale first."""
        if self.fp8_gemm not in FP8_GEMM_PATHS:
            raise ValueError(f"fp8_gemm {self.fp8_gemm!r} is not one of {FP8_GEMM_PATHS}")
        linear = name[: -len(".weight")]
        scale = self._scalar(rank, linear + ".weights_scaling_factor")
        pair = self.fused_pair(linear)
        if pair is not None:
            new = max(self._scalar(rank, n + ".weights_scaling_factor") for n in pair)
            q, scale = fp8_requantized(q, scale, new), new
        return fp8_weight_value(q, scale, self.dtype, self.fp8_gemm)

    def product(self, x: torch.Tensor, rank: int, name: str) -> torch.Tensor:
        """``x @ W.T`` for checkpoint linear weight ``name`` of ``rank``; a weight whose input features are not the
        layer's (a stored tensor of the wrong shape) is named, with both sizes, instead of failing in the product."""
        w = self.weight(rank, name)
        if w.dim() != 2 or w.shape[-1] != x.shape[-1]:
            raise CheckpointError(f"rank{rank}.safetensors: {name} multiplies as {tuple(w.shape)}, but the layer's "
                                  f"input has {x.shape[-1]} features (config.json's sizes at tp {self.ckpt.tp_size})",
                                  where=str(self.ckpt.path),
                                  fix="the rank files must be the ones written with this config.json: convert again")
        return x @ w.T

    def linear_input(self, x: torch.Tensor, rank: int, linear: str) -> torch.Tensor:
        """The input of checkpoint linear ``linear`` as it multiplies the weight: FP8 linears quantize it
        (``FP8Linear.forward``: ``x / s_a`` saturated to float8_e4m3fn; the product is scaled by ``s_a``)."""
        if self.quant.quant_algo in TOOL_ALGOS:
            return self._tool_input(x, rank, linear)
        if (not self.quantize_activations or self.quant.quant_algo != "FP8"
                or not fp8_quantized(linear + ".weight", self.exclude)):
            return x
        key = (rank, linear + ".activation_scaling_factor")
        if not self._kept(self._weights, *key):
            pair = self.fused_pair(linear)
            self._weights[key] = torch.tensor(max(self._scalar(rank, n + ".activation_scaling_factor")
                                                  for n in (pair or (linear,))))
        return fp8_input_value(x, float(self._weights[key]), self.dtype, self.fp8_gemm)

    def _tool_input(self, x: torch.Tensor, rank: int, linear: str) -> torch.Tensor:
        """AWQ / SmoothQuant inputs: times the pre-quant scale, rounded to the model dtype; SmoothQuant's then
        quantized per tensor. Both roundings are off with ``quantize_activations``, as FP8's is."""
        key = (rank, linear + ".prequant_scaling_factor")
        if not self.has(*key):
            return x
        if not self._kept(self._weights, *key):
            self._weights[key] = self.ckpt.tensor(*key).float().reshape(-1).to(self.device)
        x = smoothed_input(x, self._weights[key], self.dtype, rounded=self.quantize_activations)
        if self.quant.quant_algo == SQ and self.quantize_activations:
            x = sq_activation(x, self._scalar(rank, linear + ".activation_scaling_factor"), self.dtype)
        return x

    def _kv_scale(self, rank: int, prefix: str) -> float | None:
        if not self.quant.kv_cache_quant_algo or not self.quantize_kv:
            return None
        key = (rank, prefix + "kv_cache_scaling_factor")
        if not self._kept(self._weights, *key):
            if not self.has(rank, key[1]) and self.has(rank, prefix + "k_cache_scaling_factor"):
                # ModelOpt writes k and v scales; preprocess_weights loads their max (process_kv_scaling_factor)
                self._weights[key] = torch.maximum(self.ckpt.tensor(rank, prefix + "k_cache_scaling_factor").float(),
                                                   self.ckpt.tensor(rank, prefix + "v_cache_scaling_factor").float())
            else:
                self._weights[key] = self.ckpt.tensor(rank, key[1]).float()
        return float(self._weights[key].reshape(-1)[0])

    def stored(self, rank: int, name: str) -> torch.Tensor:
        """Tensor ``name`` of ``rank`` as the checkpoint stores it (half the memory of float32 for
        float16 / bfloat16), read once and kept (streaming: while its group is in use): for tables that are
        indexed, not multiplied."""
        key = (rank, name)
        if not self._kept(self._stored, rank, name):
            self._stored[key] = self.ckpt.tensor(rank, name).to(self.device)
        return self._stored[key]

    def has(self, rank: int, name: str) -> bool:
        return self.ckpt.has(rank, name)

    def _plus_bias(self, y: torch.Tensor, rank: int, name: str) -> torch.Tensor:
        """``y`` plus rank ``rank``'s bias ``name`` where the checkpoint has one (the one place a
        column-parallel or rank-local bias is added; row-parallel biases go through :meth:`_row_bias`)."""
        return y + self.weight(rank, name) if self.has(rank, name) else y

    def _column_parallel(self, x: torch.Tensor, stage: int, weight: str, bias: str | None = None) -> torch.Tensor:
        """``x W^T (+ b)`` of a column-parallel layer: each rank's output, gathered (concatenated)."""
        outs = []
        for r in self.stage_ranks(stage):
            y = self.product(x, r, weight)
            outs.append(self._plus_bias(y, r, bias) if bias is not None else y)
        return torch.cat(outs, dim=-1)

    # -- building blocks -------------------------------------------------------------
    def norm(self, x: torch.Tensor, rank: int, prefix: str, eps: float | None = None) -> torch.Tensor:
        w = self.weight(rank, prefix + ".weight")
        b = self.weight(rank, prefix + ".bias") if self.has(rank, prefix + ".bias") else None
        eps = self.semantics.norm_epsilon if eps is None else eps
        if self.semantics.norm is NormKind.LAYER:
            return F.layer_norm(x, (x.shape[-1],), w, b, eps)
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        return y + b if b is not None else y

    def _lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of a first-stage table, gathered from the ranks' shards under parallel embedding."""
        ranks = self.stage_ranks(0)
        if self.config.get("use_parallel_embedding") and self.tp > 1:
            if int(self.config.get("embedding_sharding_dim", 0)) == 0:
                out = torch.zeros(ids.shape[0], self.hidden_size)
                for r in ranks:
                    table = self.stored(r, name)
                    lo = self.mapping.tp_rank(r) * table.shape[0]
                    local = ids - lo
                    ok = (local >= 0) & (local < table.shape[0])
                    out[ok] += table[local[ok]].float()
                return out
            return torch.cat([self.stored(r, name)[ids].float() for r in ranks], dim=-1)
        return self.stored(ranks[0], name)[ids].float()

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings; with learned absolute positions plus the table's rows at ``positions`` (each tree
        token at its sequence position plus its offset: tensorrt_llm/models/gpt/model.py ``GPTModel.forward``
        adds ``position_embedding(position_ids)``, the ids our engine class rebuilds per tree token)."""
        ranks = self.stage_ranks(0)
        x = self._lookup("transformer.vocab_embedding.weight", tokens)
        x = x * self.semantics.embedding_scale
        if self.semantics.position_embedding is PositionEmbedding.LEARNED_ABSOLUTE:
            table = int(self.config.get("max_position_embeddings") or 0)
            if positions is None or int(positions.max()) >= table:
                raise CheckpointError(
                    f"a token at position {None if positions is None else int(positions.max())} is past the learned "
                    f"position table's {table} rows (max_position_embeddings)", where=str(self.ckpt.path),
                    fix=f"keep prompts + new tokens + the tree's depth within {table}")
            x = x + self._lookup("transformer.position_embedding.weight", positions)
        if self.semantics.has_embedding_norm:
            x = self.norm(x, ranks[0], "transformer.ln_embed")
        return x

    def is_sliding_layer(self, layer: int) -> bool:
        pattern = self.semantics.sliding_window_pattern
        return bool(pattern) and bool((layer + 1) % pattern)

    def rotary_tables(self, positions: torch.Tensor, long: bool = False) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """``cos, sin`` ``[T, rotary_dim / 2]`` at ``positions``, for global (False) and local (True)
        layers: computed once per forward pass, used by every layer. ``long``: long_rope's long table (the
        step's compared length is past ``original_max_position_embeddings``: :meth:`long_table`)."""
        if not self.semantics.position_embedding.is_rope:
            return {}
        tables = {}
        for local in (False, True):
            if local and self.semantics.local_rotary_base is None:
                continue
            inv = self.local_inv_freq if local else self.long_inv_freq if long else self.inv_freq
            # float32 angles, cos and sin, then the scale: the engine's table (reference/rope.py); the angle's
            # rounding grows with the position (~6e-4 rad at 131,071 on a tiny test head), which a float64 angle would not show
            angles = positions.float()[:, None] * inv[None, :]  # [T, rot/2]
            m = self._mscale[long]
            tables[local] = (angles.cos() * m, angles.sin() * m) if m != 1.0 else (angles.cos(), angles.sin())
        return tables

    def rope(self, x: torch.Tensor, positions: torch.Tensor, layer: int = 0,
             tables: dict[bool, tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """Rotate the first ``rotary_dim`` features of ``x`` ``[heads, T, D]`` at ``positions``."""
        rot = self.rotary_dim
        tables = tables if tables is not None else self.rotary_tables(positions)
        local = self.semantics.local_rotary_base is not None and self.is_sliding_layer(layer)
        cos, sin = tables[local]
        rotated, passed = x[..., :rot], x[..., rot:]
        if self.semantics.position_embedding is PositionEmbedding.ROPE_GPTJ:
            x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        else:  # rope_gpt_neox: halves
            half = rot // 2
            x1, x2 = rotated[..., :half], rotated[..., half:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return torch.cat([out, passed], dim=-1) if passed.shape[-1] else out

    def alibi_slopes(self) -> torch.Tensor:
        """Per-head ALiBi slopes (HF BloomModel ``build_alibi_tensor`` / MPT ``gen_slopes``)."""
        n, bias_max = self.num_attention_heads, self.semantics.alibi_bias_max
        if self.semantics.alibi_style is AlibiStyle.MPT:
            padded = 2 ** math.ceil(math.log2(n))
            m = torch.arange(1, padded + 1, dtype=torch.float64) * (bias_max / padded)
            slopes = 1.0 / torch.pow(2.0, m)
            if padded != n:
                slopes = torch.cat([slopes[1::2], slopes[::2]])[:n]
            return slopes.float()
        closest = 2 ** math.floor(math.log2(n))
        base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
        slopes = [base ** (i + 1) for i in range(closest)]
        if closest < n:
            extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
            slopes += [extra ** (2 * i + 1) for i in range(n - closest)]
        return torch.tensor(slopes)

    def attention(self, x: torch.Tensor, stage: int, stage_layer: int, layer: LayerCache, positions: torch.Tensor,
                  all_positions: torch.Tensor, visible: torch.Tensor, global_layer: int = 0,
                  rotary: dict[bool, tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """One layer's attention over the ranks of ``stage``; ``visible`` is ``[T, S]`` bool."""
        head_size, q_heads, kv_heads = self.head_size, self.local_attention_heads, self.local_kv_heads
        group = q_heads // kv_heads
        semantics = self.semantics
        prefix = f"transformer.layers.{stage_layer}.attention."
        out = None
        scale = semantics.attention_scale if semantics.attention_scale is not None else 1.0 / math.sqrt(head_size)
        if semantics.position_embedding.is_rope and rotary is None:
            rotary = self.rotary_tables(positions)
        hidden_mask = ~visible[None, None]  # [1, 1, T, S]
        num_tokens = x.shape[0]
        for tp_rank, r in enumerate(self.stage_ranks(stage)):
            qkv = self.product(self.linear_input(x, r, prefix + "qkv"), r, prefix + "qkv.weight")
            qkv = self._plus_bias(qkv, r, prefix + "qkv.bias")
            if semantics.clip_qkv:
                qkv = qkv.clamp(-semantics.clip_qkv, semantics.clip_qkv)
            # the query and key heads side by side [q_heads + kv_heads, T, D]: RoPE rotates both in one pass (the
            # same element-wise products per head; half RoPE's small operations, which dominate at these sizes)
            qk = qkv[:, : (q_heads + kv_heads) * head_size].reshape(num_tokens, q_heads + kv_heads, head_size)
            qk = qk.transpose(0, 1)
            v = qkv[:, (q_heads + kv_heads) * head_size :].reshape(num_tokens, kv_heads, head_size).transpose(0, 1)
            if semantics.qk_norm:
                qk = torch.cat([self.norm(qk[:q_heads], r, prefix + "q_layernorm", semantics.qk_norm_epsilon),
                                self.norm(qk[q_heads:], r, prefix + "k_layernorm", semantics.qk_norm_epsilon)])
            if semantics.position_embedding.is_rope:
                qk = self.rope(qk, positions, global_layer, rotary)
            q, k = qk[:q_heads], qk[q_heads:]
            kv_scale = self._kv_scale(r, prefix)
            context_phase = layer.k[tp_rank].shape[1] == 0
            if kv_scale is not None:  # the cache holds quantized K/V; generation (XQA) reads them back from it,
                algo = self.quant.kv_cache_quant_algo  # the context phase attends to its own unquantized K/V
                stored_k, stored_v = kv_quantized(k, kv_scale, algo), kv_quantized(v, kv_scale, algo)
            else:
                stored_k, stored_v = k, v
            layer.k[tp_rank] = torch.cat([layer.k[tp_rank], stored_k], dim=1)
            layer.v[tp_rank] = torch.cat([layer.v[tp_rank], stored_v], dim=1)
            keys, values = (k, v) if kv_scale is not None and context_phase else (layer.k[tp_rank], layer.v[tp_rank])
            # each KV head serves ``group`` query heads: [kv, group, T, D] against [kv, 1, S, D], no copies
            grouped_q = q.reshape(kv_heads, group, num_tokens, head_size)
            scores = (grouped_q @ keys.transpose(1, 2)[:, None]) * scale  # [kv, group, T, S]
            if semantics.attn_logit_softcapping:
                cap = semantics.attn_logit_softcapping
                scores = torch.tanh(scores / cap) * cap
            if self._slopes is not None:
                slopes = self._slopes[tp_rank * q_heads : (tp_rank + 1) * q_heads].reshape(kv_heads, group)
                distance = (all_positions[None, :] - positions[:, None]).float()  # [T, S], <= 0 where visible
                scores = scores + slopes[:, :, None, None] * distance[None, None]
            scores = scores.masked_fill(hidden_mask, float("-inf"))
            context = torch.softmax(scores, dim=-1) @ values[:, None]  # [kv, group, T, D]
            context = context.reshape(q_heads, num_tokens, head_size).transpose(0, 1)
            context = self.linear_input(context.reshape(num_tokens, q_heads * head_size), r, prefix + "dense")
            part = self.product(context, r, prefix + "dense.weight")
            out = part if out is None else out + part  # all-reduce
        return self._row_bias(out, stage, prefix + "dense.bias")

    def mlp(self, x: torch.Tensor, stage: int, stage_layer: int) -> torch.Tensor:
        if self.semantics.moe_num_experts:
            return self.moe(x, stage, stage_layer)
        prefix = f"transformer.layers.{stage_layer}.mlp."
        out = None
        ranks = self.stage_ranks(stage)
        for r in ranks:
            h = self.product(self.linear_input(x, r, prefix + "fc"), r, prefix + "fc.weight")
            h = self._plus_bias(h, r, prefix + "fc.bias")
            if self.semantics.mlp is MlpKind.GATED:
                gate = self.product(self.linear_input(x, r, prefix + "gate"), r, prefix + "gate.weight")
                gate = self._plus_bias(gate, r, prefix + "gate.bias")
                h = self.act(h) * gate
            elif self.semantics.mlp is MlpKind.SWIGLU:  # fused [up ; gate]: act on the second half
                up, gate = h.chunk(2, dim=-1)
                h = self.act(gate) * up
            else:
                h = self.act(h)
            part = self.product(self.linear_input(h, r, prefix + "proj"), r, prefix + "proj.weight")
            out = part if out is None else out + part
        return self._row_bias(out, stage, prefix + "proj.bias")

    def moe(self, x: torch.Tensor, stage: int, stage_layer: int) -> torch.Tensor:
        """A mixture-of-experts MLP as TensorRT-LLM's ``MOE`` layer computes it (tensorrt_llm/layers/moe.py):
        router logits in float32 from the float32 router, the experts per token and their weights by the
        checkpoint's routing (reference/routing.py: RENORMALIZE, NONE, SPARSE_MIXER); each expert
        ``proj(up * silu(gate))`` with ``fc = [up; gate]`` split on the intermediate dim across the ranks, whose
        partial outputs are summed (the all-reduce)."""
        prefix = f"transformer.layers.{stage_layer}.mlp."
        ranks = self.stage_ranks(stage)
        logits = x.float() @ self.weight(ranks[0], prefix + "router.weight").T  # [T, E]
        weights, chosen = route(logits, self.semantics)  # reference/routing.py
        if self.moe_activity is not None:  # verify counts the experts each step wakes
            self.moe_activity.append((x.shape[0], int(chosen.unique().numel())))
        out = torch.zeros_like(x)
        for r in ranks:
            fc, proj = self.weight(r, prefix + "fc.weight"), self.weight(r, prefix + "proj.weight")
            half, held = fc.shape[1] // 2, fc.shape[0]  # expert parallelism: this rank holds experts first.. +held
            first = self.mapping.moe_ep_rank(r) * held
            for e in chosen.unique().tolist():
                if not first <= e < first + held:
                    continue
                rows, slot = (chosen == e).nonzero(as_tuple=True)
                h = x[rows] @ fc[e - first].T
                y = (h[:, :half] * self.act(h[:, half:])) @ proj[e - first].T
                out.index_add_(0, rows, y * weights[rows, slot, None])
        if self.semantics.moe_shared_expert:  # SharedMoE: + sigmoid(gate(x)) * shared(x), one all-reduce for both
            gate = torch.sigmoid(x @ self.weight(ranks[0], prefix + "shared_expert_gate.weight").T)  # [T, 1]
            for r in ranks:
                h = x @ self.weight(r, prefix + "shared_expert.fc.weight").T
                half = h.shape[-1] // 2
                out = out + gate * ((h[:, :half] * self.act(h[:, half:])) @ self.weight(r, prefix + "shared_expert.proj.weight").T)
        return out

    def _row_bias(self, out: torch.Tensor, stage: int, name: str) -> torch.Tensor:
        """A row-parallel layer's all-reduced output plus its bias: added once after the all-reduce (rank 0's
        copy, every rank holds the same), or by every rank before it (``row_bias_every_rank``: their sum)."""
        ranks = self.stage_ranks(stage)
        if not self.has(ranks[0], name):
            return out
        if self.semantics.row_bias_every_rank:
            for r in ranks:
                out = out + self.weight(r, name)
            return out
        return out + self.weight(ranks[0], name)

    def decoder_layer(self, x, stage, stage_layer, layer_cache, positions, all_positions, visible, global_layer,
                      rotary=None):
        first_rank = self.stage_ranks(stage)[0]
        prefix = f"transformer.layers.{stage_layer}."
        semantics = self.semantics
        if semantics.post_norm:  # OPT-350m: each norm after its residual add, on the sum
            attn = self.attention(x, stage, stage_layer, layer_cache, positions, all_positions, visible, global_layer,
                                  rotary)
            x = self.norm(x + attn, first_rank, prefix + "input_layernorm")
            return self.norm(x + self.mlp(x, stage, stage_layer), first_rank, prefix + semantics.mlp_norm)
        normed = self.norm(x, first_rank, prefix + "input_layernorm")
        attn = self.attention(normed, stage, stage_layer, layer_cache, positions, all_positions, visible, global_layer,
                              rotary)
        if semantics.parallel_residual:
            mlp_in = normed if semantics.shared_input_norm else self.norm(x, first_rank, prefix + semantics.mlp_norm)
            return x + attn + self.mlp(mlp_in, stage, stage_layer)
        if semantics.post_attention_norm_after:  # Gemma2/3 sandwich norms
            attn = self.norm(attn, first_rank, prefix + "post_layernorm")
            x = x + attn
            mlp_out = self.mlp(self.norm(x, first_rank, prefix + "pre_feedforward_layernorm"), stage, stage_layer)
            return x + self.norm(mlp_out, first_rank, prefix + "post_feedforward_layernorm")
        x = x + attn * semantics.residual_scale
        mlp_out = self.mlp(self.norm(x, first_rank, prefix + semantics.mlp_norm), stage, stage_layer)
        return x + mlp_out * semantics.residual_scale  # Granite's residual_multiplier (1 elsewhere)

    # -- model -------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        cache = KVCache()
        for _ in range(self.num_layers):
            empty = [torch.zeros(self.local_kv_heads, 0, self.head_size) for _ in range(self.tp)]
            cache.layers.append(LayerCache(list(empty), [e.clone() for e in empty]))
        return cache

    @torch.inference_mode()  # nothing here is ever trained on: no autograd bookkeeping (no_grad still keeps some)
    def forward(
        self,
        tokens: torch.Tensor | list[int],
        cache: KVCache,
        *,
        spec_decoding_position_offsets: torch.Tensor | list[int] | None = None,
        spec_decoding_packed_mask: torch.Tensor | list[list[int]] | None = None,
        record: list | None = None,
        compute_logits: bool = True,
        context_chunk: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Run ``tokens`` after the cached ones; returns ``(logits [T, vocab], final hidden [T, H])``.

        Without spec-decoding inputs the tokens are causal and consecutive (context
        phase, or plain decoding). With them, token i sits at position
        ``past + offsets[i]`` and sees the past plus the tree tokens whose bits are
        set in its packed-mask row. ``record`` (a list) receives the hidden state
        after the embedding, after each layer, and after the final norm (for locating divergences).
        ``compute_logits=False`` returns ``(None, hidden)``: callers that need the vocabulary
        projection of a few rows only apply :meth:`logits` to those. The first forward of a cache is the request's
        context step; later ones are generation steps, unless ``context_chunk`` (a further chunk of the prompt, as
        chunked context computes it): long_rope picks its table by that (:meth:`long_table`).
        """
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        num_tokens = tokens.shape[0]
        past = cache.length
        context = past == 0 or context_chunk
        if context:
            cache.context_length = (cache.context_length if past else 0) + num_tokens
        if spec_decoding_position_offsets is None:
            positions = past + torch.arange(num_tokens)
            tree_visible = torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool))
        else:
            offsets = torch.as_tensor(spec_decoding_position_offsets, dtype=torch.long)
            if spec_decoding_packed_mask is None or offsets.shape[0] != num_tokens:
                raise ValueError("spec decoding needs position offsets and a packed mask, one row per token")
            positions = past + offsets
            tree_visible = unpack_mask(spec_decoding_packed_mask, num_tokens)
        all_positions = torch.cat([cache.positions, positions])
        self._within_window(all_positions)
        visible = torch.cat([torch.ones(num_tokens, past, dtype=torch.bool), tree_visible], dim=1)
        rotary = self.rotary_tables(positions, self.long_table(cache, num_tokens if context else None))
        x = self.embed(tokens, positions)
        if record is not None:
            record.append(x.clone())
        global_layer = 0
        for stage in range(self.pp):
            for stage_layer, _ in enumerate(self.mapping.layers_of_stage(self.num_layers, stage)):
                x = self.decoder_layer(x, stage, stage_layer, cache.layers[global_layer], positions, all_positions,
                                       visible, global_layer, rotary)
                global_layer += 1
                if record is not None:
                    record.append(x.clone())
        cache.positions = all_positions
        last = self.stage_ranks(self.pp - 1)
        hidden = self.norm(x, last[0], "transformer.ln_f") if self.semantics.final_norm else x
        if record is not None:
            record.append(hidden.clone())
        return (self.logits(hidden) if compute_logits else None), hidden

    def _within_window(self, all_positions: torch.Tensor) -> None:
        """A sequence longer than the sliding window is refused: the executor has no windowed attention."""
        window = self.semantics.sliding_window
        if window and int(all_positions.max()) + 1 > window:
            raise CheckpointError(
                f"the sequence reaches {int(all_positions.max()) + 1} tokens, beyond the sliding window "
                f"of {window}; the reference executor does not implement windowed attention",
                where=str(self.ckpt.path),
                fix=f"verify with prompts + new tokens <= {window}",
            )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        stage = self.pp - 1
        bias = "lm_head.bias" if self.has(self.stage_ranks(stage)[0], "lm_head.bias") else None  # Phi-2
        out = self._column_parallel(hidden, stage, "lm_head.weight", bias)[..., : self.vocab] * self.semantics.logits_scale
        if self.semantics.final_logit_softcapping:
            cap = self.semantics.final_logit_softcapping
            out = torch.tanh(out / cap) * cap
        return out

    @torch.inference_mode()
    def medusa_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[num_medusa_heads, ..., vocab]`` for final-norm hidden states (the engine's ``medusa_logits``)."""
        stage = self.pp - 1
        shared = bool(self.config.get("medusa_shared_lm_head"))
        base_bias = "lm_head.bias" if shared and self.has(self.stage_ranks(stage)[0], "lm_head.bias") else None
        if not self.num_medusa_heads:
            return torch.zeros((0,) + tuple(hidden.shape[:-1]) + (self.vocab,))
        features = []
        for h in range(self.num_medusa_heads):
            x = hidden
            for layer in range(self.num_medusa_layers):
                p = f"medusa_heads.{h}.medusa_layers.{layer}.linear."
                x = x + self.medusa_act(self._column_parallel(x, stage, p + "weight", p + "bias"))
            features.append(x)
        if shared:  # one projection for every head: the base lm_head (bias and all) is read once
            return self._column_parallel(torch.stack(features), stage, "lm_head.weight", base_bias)[..., : self.vocab]
        return torch.stack([self._column_parallel(x, stage, f"medusa_heads.{h}.lm_head.weight")[..., : self.vocab]
                            for h, x in enumerate(features)])
