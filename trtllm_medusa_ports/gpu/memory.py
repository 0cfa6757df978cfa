"""How much GPU memory an engine of this checkpoint holds per rank, before any build.

Weights per rank come from the conversion's own plan - the rank files' tensors, names, dtypes and shapes
(convert.py ``plan_layout``, the same that ``convert`` writes) - split into the base, the Medusa ResBlocks
and the Medusa lm_heads, in the bytes the engine keeps them in: weight-only linears as TensorRT-LLM
quantizes them at load (1 byte a weight for W8A16, half for W4A16, plus a per-channel scale in the
model dtype), FP8 as written. KV cache per token and rank: K and V of each layer of the rank's stage, its
KV heads, at the KV-cache dtype (1 byte for INT8 / FP8). Not counted: activations and the runtime's
workspace (typically 1-2 GB, more with a large ``max_num_tokens``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trtllm_medusa_ports.files.dtypes import itemsize
from trtllm_medusa_ports.quant import BITS, QuantSpec, fp8_quantized, weight_only_quantized
from trtllm_medusa_ports.weights.sharding import Mapping, kv_heads_per_rank

GB = 1e9


def _size(n: float) -> str:
    return f"{n / GB:.3f} GB" if n >= 0.1 * GB else f"{n / 1e6:.2f} MB"


@dataclass
class MemoryPlan:
    dtype: str
    quantization: str
    tp_size: int
    pp_size: int
    #: per rank, bytes
    base_bytes: list[int]
    medusa_resblock_bytes: list[int]
    medusa_lm_head_bytes: list[int]
    #: bytes the heads would hold with one lm_head copy each, when they share the base's (0 otherwise), per rank
    shared_lm_head_saved_bytes: int
    kv_cache_dtype: str
    kv_bytes_per_token: list[int]
    max_draft_len: int

    def weight_bytes(self, rank: int) -> int:
        return self.base_bytes[rank] + self.medusa_resblock_bytes[rank] + self.medusa_lm_head_bytes[rank]

    def kv_bytes(self, rank: int, batch: int, seq_len: int) -> int:
        """KV cache of ``batch`` sequences of ``seq_len`` tokens, plus the ``max_draft_len`` slots each that the
        engine reserves for the tree (tensorrt_llm/builder.py build adds it to max_seq_len)."""
        return self.kv_bytes_per_token[rank] * batch * (seq_len + self.max_draft_len)

    def _worst(self, batch: int | None, seq_len: int | None) -> int:
        return max(range(len(self.base_bytes)),
                   key=lambda r: self.weight_bytes(r) + (self.kv_bytes(r, batch, seq_len) if batch and seq_len else 0))

    def to_dict(self, batch: int | None = None, seq_len: int | None = None, gpu_memory_gb: float | None = None) -> dict:
        d = asdict(self)
        ranks = range(len(self.base_bytes))
        d["weight_bytes"] = [self.weight_bytes(r) for r in ranks]
        if batch and seq_len:
            d["batch"], d["seq_len"] = batch, seq_len
            d["kv_cache_bytes"] = [self.kv_bytes(r, batch, seq_len) for r in ranks]
            d["total_bytes"] = [w + k for w, k in zip(d["weight_bytes"], d["kv_cache_bytes"], strict=True)]
        if gpu_memory_gb:  # without both serving sizes the weights alone are judged, and said to be
            d["gpu_memory_gb"] = gpu_memory_gb
            d["judged"] = JUDGED_ALL if batch and seq_len else JUDGED_WEIGHTS
            d["fits"] = max(d.get("total_bytes", d["weight_bytes"])) <= gpu_memory_gb * GB
        return d

    def render(self, batch: int | None = None, seq_len: int | None = None, gpu_memory_gb: float | None = None) -> str:
        r = self._worst(batch, seq_len)
        lines = [f"memory of rank {r} (of {len(self.base_bytes)}; the fullest), {self.quantization}, {self.dtype}: "
                 f"weights {_size(self.weight_bytes(r))} = base {_size(self.base_bytes[r])} + Medusa ResBlocks "
                 f"{_size(self.medusa_resblock_bytes[r])} + Medusa lm_heads {_size(self.medusa_lm_head_bytes[r])}"]
        if self.shared_lm_head_saved_bytes:
            lines.append(f"  sharing the base lm_head saves {_size(self.shared_lm_head_saved_bytes)} on the last stage's ranks")
        lines.append(f"  KV cache ({self.kv_cache_dtype}): {self.kv_bytes_per_token[r] / 1e3:.1f} kB per token")
        if batch and seq_len:
            kv = self.kv_bytes(r, batch, seq_len)
            total = self.weight_bytes(r) + kv
            line = (f"  batch {batch} x {seq_len} tokens (+{self.max_draft_len} tree slots each): KV {_size(kv)}, "
                    f"weights + KV {_size(total)}")
            if gpu_memory_gb:
                line += (f" of {gpu_memory_gb:g} GB: {'fits' if total <= gpu_memory_gb * GB else 'DOES NOT FIT'}"
                         " (before activations and the runtime's workspace, typically 1-2 GB)")
            lines.append(line)
        elif gpu_memory_gb:
            w = max(self.weight_bytes(q) for q in range(len(self.base_bytes)))
            lines.append(f"  weights alone of {gpu_memory_gb:g} GB: "
                         f"{'fit' if w <= gpu_memory_gb * GB else 'DO NOT FIT'} ({KV_NOT_JUDGED})")
        return "\n".join(lines)


#: what a plan's ``fits`` judged (``to_dict()["judged"]``)
JUDGED_ALL = "weights and KV cache"
JUDGED_WEIGHTS = "weights alone"
KV_NOT_JUDGED = ("the KV cache was not judged: pass --max_batch_size and --max_seq_len to judge weights and KV cache "
                 "together")


def _engine_bytes(name: str, dtype: str, shape: tuple[int, ...], spec: QuantSpec, exclude: list[str] | None) -> int:
    n = 1
    for s in shape:
        n *= s
    if spec.quant_algo in BITS and len(shape) in (2, 3) and weight_only_quantized(name, exclude):
        # + per_channel_scale [out] ([experts, out] for stacked experts, quantized at load as well)
        return n * BITS[spec.quant_algo] // 8 + (n // shape[-1]) * itemsize(dtype)
    if spec.quant_algo == "FP8" and dtype != "float8_e4m3fn" and fp8_quantized(name, exclude):
        return n + 8  # planned before the FP8 jobs (check): the FP8 weight and its two float32 scales
    return n * itemsize(dtype)


def memory_plan(cfg: dict, entries: dict[int, list[tuple[str, str, tuple[int, ...]]]]) -> MemoryPlan:
    """The plan of a checkpoint config and its rank files' planned entries (``(name, dtype, shape)``)."""
    spec = QuantSpec.from_config(cfg)
    exclude = (cfg.get("quantization") or {}).get("exclude_modules")
    mapping = Mapping.from_config(cfg)
    dtype = cfg["dtype"]
    base, resblocks, lm_heads, kv_tok = [], [], [], []
    kv_local = kv_heads_per_rank(int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]), mapping.tp_size)
    head_size = int(cfg.get("head_size") or cfg["hidden_size"] // cfg["num_attention_heads"])
    kv_item = 1 if spec.kv_cache_quant_algo else itemsize(dtype)
    for rank in range(mapping.world_size):
        parts = {"base": 0, "resblock": 0, "lm_head": 0}
        for name, dt, shape in entries[rank]:
            kind = ("resblock" if ".medusa_layers." in name else "lm_head") if name.startswith("medusa_heads.") else "base"
            parts[kind] += _engine_bytes(name, dt, shape, spec, exclude)
        base.append(parts["base"])
        resblocks.append(parts["resblock"])
        lm_heads.append(parts["lm_head"])
        n_layers = len(mapping.layers_of_stage(int(cfg["num_hidden_layers"]), mapping.pp_rank(rank)))
        kv_tok.append(2 * n_layers * kv_local * head_size * kv_item)
    saved = 0
    if cfg.get("medusa_shared_lm_head"):
        last = mapping.stage_ranks(mapping.pp_size - 1)[0]
        lm = next((s for n, _, s in entries[last] if n == "lm_head.weight"), None)
        if lm is not None:
            saved = int(cfg.get("num_medusa_heads", 0)) * lm[0] * lm[1] * itemsize(dtype)
    return MemoryPlan(dtype, spec.quant_algo or "float", mapping.tp_size, mapping.pp_size, base, resblocks, lm_heads,
                      saved, spec.kv_cache_quant_algo or dtype, kv_tok, int(cfg.get("max_draft_len") or 0))
