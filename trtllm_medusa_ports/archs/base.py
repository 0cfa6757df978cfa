"""What a base-model family adapter declares, and the registry that finds it.

An adapter is mostly data: a config mapping (HF config.json -> TensorRT-LLM
config.json fields), a weight table (TensorRT-LLM name <- HF names, a combine
step, a split rule), a position-embedding kind, and the semantics the CPU
reference executor needs (norm, MLP, residual layout, ...), which it derives
from the *TensorRT-LLM* config so that verification reads only the artifact.

A new family subclasses the closest existing adapter and overrides the few
hooks where it differs (see docs/porting-guide.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

#: Combine the loaded HF tensors of one rule into one tensor, or (q, k, v) for Split.QKV.
Combine = Callable[[list[torch.Tensor]], "torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]"]


def _first(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


def _as_qkv(ts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = ts
    return q, k, v


@dataclass(frozen=True)
class WeightRule:
    """One TensorRT-LLM tensor: where it comes from and how it is cut.

    ``sources`` are HF tensor names; ``{i}`` stands for the HF layer index.
    ``alternatives`` are tried in order when the first names are absent (tied
    embeddings: ``lm_head.weight`` or else ``model.embed_tokens.weight``).
    """

    name: str
    sources: tuple[str, ...]
    split: Split = Split.REPLICATE
    combine: Combine = _first
    alternatives: tuple[tuple[str, ...], ...] = ()

    def candidates(self) -> tuple[tuple[str, ...], ...]:
        return (self.sources,) + self.alternatives


def qkv_rule(name: str, q: str, k: str, v: str) -> WeightRule:
    return WeightRule(name, (q, k, v), Split.QKV, _as_qkv)


@dataclass(frozen=True)
class Semantics:
    """How the network computes, as the reference executor and engine adapters need it.

    Derived from the TensorRT-LLM config.json by the family adapter.
    """

    norm: str = "rms"  # "rms" | "layer"
    norm_epsilon: float = 1e-6
    mlp: str = "gated"  # "gated" (act(fc) * gate, then proj) | "plain" (act(fc), then proj)
    hidden_act: str = "silu"
    position_embedding: str = "rope_gpt_neox"  # | "rope_gptj" | "alibi" | "learned_absolute"
    rotary_dim: int = 0  # 0 = the whole head
    rotary_base: float = 10000.0
    rotary_scaling: dict | None = None
    parallel_residual: bool = False  # x + attn(ln(x)) + mlp(ln2(x)) (GPT-NeoX) / shared ln (Phi-2, Falcon)
    shared_input_norm: bool = False  # parallel residual reading one norm (Falcon-7B, Phi-2)
    embedding_scale: float = 1.0
    has_embedding_norm: bool = False  # Bloom's word_embeddings_layernorm
    attention_scale: float | None = None  # None = 1/sqrt(head_size)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    qk_norm: bool = False
    post_attention_norm_after: bool = False  # Gemma2/3: norm on the attention output too


class ArchAdapter:
    """Base adapter: a Llama-shaped decoder. Families override class data and a few hooks."""

    #: HF ``architectures[0]`` names this adapter serves (the registry keys)
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    #: short family name, also ``--model_type`` and the HF ``model_type`` values it accepts
    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: TensorRT-LLM 1.2.x class the engine derives from (tensorrt_llm/models/__init__.py MODEL_MAP)
    trtllm_base_class: ClassVar[str] = ""
    #: True when upstream MedusaForCausalLM (tensorrt_llm/models/medusa/model.py) builds this base
    #: correctly as it is (it only knows LLaMAForCausalLM and QWenForCausalLM)
    upstream_medusa_base: ClassVar[bool] = False
    #: True when upstream's decoder layers pass spec_decoding_params to Attention
    upstream_spec_decoding_plumbing: ClassVar[bool] = False
    position_embedding_kind: ClassVar[str] = "rope_gpt_neox"
    #: HF tensor names that are not weights (buffers some checkpoints carry)
    ignored_hf_tensors: ClassVar[tuple[str, ...]] = (r".*rotary_emb\.inv_freq", r"medusa_head\..*")

    # -- config ---------------------------------------------------------------------------
    def head_size(self, hf: HFConfig) -> int:
        explicit = hf.get("head_dim")
        if isinstance(explicit, int) and explicit > 0:
            return explicit
        hidden = hf.require("hidden_size")
        heads = hf.require("num_attention_heads")
        if hidden % heads:
            raise ModelError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no head_dim is given",
                where=str(hf.path),
                fix="add head_dim to config.json",
            )
        return hidden // heads

    def trtllm_config(self, hf: HFConfig) -> dict:
        """The family's fields of TensorRT-LLM's config.json (no Medusa, dtype or mapping keys)."""
        heads = hf.require("num_attention_heads")
        return {
            "num_hidden_layers": hf.require("num_hidden_layers"),
            "num_attention_heads": heads,
            "num_key_value_heads": hf.get("num_key_value_heads") or heads,
            "hidden_size": hf.require("hidden_size"),
            "head_size": self.head_size(hf),
            "intermediate_size": hf.require("intermediate_size"),
            "vocab_size": hf.require("vocab_size"),
            "max_position_embeddings": hf.get("max_position_embeddings") or 2048,
            "hidden_act": hf.get("hidden_act", "silu"),
            "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
            "position_embedding_type": self.position_embedding_kind,
            "rotary_base": hf.rope_theta,
            "rotary_scaling": hf.rope_scaling,
            "model_type": self.family,
        }

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return bool(hf.get("tie_word_embeddings", False))

    # -- weights --------------------------------------------------------------------------
    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Rules of one decoder layer; TensorRT-LLM names are relative to ``transformer.layers.{n}.``."""
        raise NotImplementedError

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the first pipeline stage (vocab_embedding and friends)."""
        raise NotImplementedError

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the last pipeline stage (ln_f, lm_head)."""
        raise NotImplementedError

    def num_hf_layers(self, hf: HFConfig) -> int:
        return int(hf.require("num_hidden_layers"))

    # -- semantics ------------------------------------------------------------------------
    def semantics(self, cfg: dict) -> Semantics:
        return Semantics(
            norm="rms",
            norm_epsilon=float(cfg.get("norm_epsilon", 1e-6)),
            mlp="gated",
            hidden_act=cfg.get("hidden_act", "silu"),
            position_embedding=cfg.get("position_embedding_type", self.position_embedding_kind),
            rotary_dim=int(cfg.get("rotary_dim", 0) or 0),
            rotary_base=float(cfg.get("rotary_base", 10000.0)),
            rotary_scaling=cfg.get("rotary_scaling"),
        )

    # -- naming ---------------------------------------------------------------------------
    def ported_architecture(self) -> str:
        """Our own ``architecture`` name for checkpoints upstream cannot build as they are.

        Deliberately absent from TensorRT-LLM's MODEL_MAP: plain ``trtllm-build``
        refuses it ("unsupported architecture") instead of building it wrong;
        ``trtllm-medusa build`` registers it first (engine/registry.py).
        """
        return f"MedusaPorts{self.trtllm_base_class}"


_REGISTRY: dict[str, type[ArchAdapter]] = {}


def register(cls: type[ArchAdapter]) -> type[ArchAdapter]:
    """Class decorator: make an adapter findable by its HF architecture names."""
    for name in cls.hf_architectures:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise AssertionError(f"{name} registered twice ({_REGISTRY[name].__name__}, {cls.__name__})")
        _REGISTRY[name] = cls
    return cls


def registry() -> dict[str, type[ArchAdapter]]:
    import trtllm_medusa_ports.archs  # noqa: F401  (registers every family)

    return dict(_REGISTRY)


def families() -> dict[str, type[ArchAdapter]]:
    return {cls.family: cls for cls in registry().values()}


def adapter_for(architecture: str) -> ArchAdapter | None:
    cls = registry().get(architecture)
    return cls() if cls else None


def adapter_for_model_type(model_type: str) -> ArchAdapter | None:
    for cls in registry().values():
        if model_type == cls.family or model_type in cls.model_types:
            return cls()
    return None


def supported_architectures() -> list[str]:
    return sorted(registry())


def rope_inv_freq(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies of RoPE, with the scaling types TensorRT-LLM 1.2.x implements.

    ``linear`` divides positions by ``factor`` (same as dividing inv_freq); ``llama3``
    rescales long wavelengths (tensorrt_llm/functional.py ``RopeEmbeddingUtils``).
    """
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    if not scaling:
        return inv
    kind = scaling.get("type") or scaling.get("rope_type")
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        orig = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = orig / low, orig / high
        smooth = (orig / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        return torch.where(is_mid, mid, scaled)
    raise ModelError(
        f"rope scaling type {kind!r} is not implemented by the reference executor",
        fix="see docs/compatibility-rules.md (rope-scaling-unsupported)",
    )


def layer_sources(rules: Sequence[WeightRule], i: int) -> list[WeightRule]:
    """Rules of layer ``i`` with ``{i}`` filled in."""
    return [
        WeightRule(
            r.name,
            tuple(s.format(i=i) for s in r.sources),
            r.split,
            r.combine,
            tuple(tuple(s.format(i=i) for s in alt) for alt in r.alternatives),
        )
        for r in rules
    ]


@dataclass
class FamilyInfo:
    """One row of the README's support table."""

    architecture: str
    position_embedding: str
    trtllm_base_class: str
    medusa_status: str
    notes: list[str] = field(default_factory=list)
