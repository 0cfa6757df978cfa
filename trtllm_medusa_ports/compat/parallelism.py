"""Parallelism rules: tensor and pipeline sizes against the base's heads, widths, vocabulary and layers, and
what the family's TensorRT-LLM class can split.

May import: ``sharding``, ``archs.base``, ``heads``, ``findings``, ``errors``, ``files.hf_model``.
"""

from __future__ import annotations

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding
from trtllm_medusa_ports.heads import MedusaHeads
from trtllm_medusa_ports.weights.sharding import Mapping


def _shape(hf: HFConfig, adapter: ArchAdapter | None) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, intermediate, hidden, layers); zeros where unknown."""
    if adapter is not None:
        try:
            return (adapter.num_attention_heads(hf), adapter.num_kv_heads(hf), adapter.intermediate_size(hf),
                    adapter.hidden_size(hf), adapter.num_hf_layers(hf))
        except PortError:
            pass
    nh = hf.get("num_attention_heads") or 0
    return (nh, hf.get("num_key_value_heads") or nh, hf.get("intermediate_size") or 0,
            hf.get("hidden_size") or 0, hf.get("num_hidden_layers") or 0)


def check_parallel(
    hf: HFConfig,
    adapter: ArchAdapter | None,
    tp_size: int,
    pp_size: int,
    heads: MedusaHeads | None = None,
    use_parallel_embedding: bool = False,
    embedding_sharding_dim: int = 0,
) -> list[Finding]:
    out: list[Finding] = []
    if tp_size < 1 or pp_size < 1:
        return [Finding("parallel-size", ERROR, f"tp_size {tp_size} / pp_size {pp_size} must be >= 1", "use positive sizes")]
    nh, kv, inter, hidden, layers = _shape(hf, adapter)
    vocab = hf.get("vocab_size") or 0
    if nh and nh % tp_size:
        out.append(Finding("tp-attention-heads", ERROR, f"num_attention_heads {nh} is not divisible by tp_size {tp_size}",
                           f"use a tp_size that divides {nh}"))
    if kv and tp_size > 1:
        if kv >= tp_size and kv % tp_size:
            out.append(Finding("tp-kv-heads", ERROR, f"num_key_value_heads {kv} is not divisible by tp_size {tp_size}",
                               f"use a tp_size that divides {kv}, or a multiple of it"))
        elif kv < tp_size and tp_size % kv:
            out.append(Finding("tp-kv-heads", ERROR, f"tp_size {tp_size} is not a multiple of num_key_value_heads {kv}",
                               f"use a tp_size that is a multiple of {kv}"))
        elif kv < tp_size:
            out.append(Finding("tp-kv-replication", INFO,
                               f"{kv} KV head(s) for tp_size {tp_size}: each KV head is replicated on {tp_size // kv} ranks",
                               "nothing to do (TensorRT-LLM's dup_kv_weight behaviour)"))
    if inter and inter % tp_size:
        out.append(Finding("tp-intermediate-size", ERROR, f"intermediate_size {inter} is not divisible by tp_size {tp_size}",
                           f"use a tp_size that divides {inter}"))
    if hidden and hidden % tp_size:
        out.append(Finding("tp-hidden-size", ERROR, f"hidden_size {hidden} is not divisible by tp_size {tp_size} "
                           "(Medusa ResBlocks are column-parallel hidden -> hidden)", f"use a tp_size that divides {hidden}"))
    if use_parallel_embedding and embedding_sharding_dim == 1 and hidden and hidden % tp_size:
        out.append(Finding("tp-embedding", ERROR, f"embedding_sharding_dim 1 needs hidden_size {hidden} divisible by tp_size",
                           "use --embedding_sharding_dim 0"))
    if vocab and tp_size > 1 and vocab % tp_size:
        padded = Mapping(tp_size, pp_size).padded_vocab(vocab)
        out.append(Finding("vocab-padding", INFO, f"vocab_size {vocab} is padded to {padded} for tp_size {tp_size} "
                           "(zero rows in lm_head and the heads' lm_heads)", "nothing to do"))
    if pp_size > 1 and adapter is not None and not adapter.engine_pipeline_parallel:
        out.append(Finding(
            "engine-pipeline-parallel", ERROR,
            f"TensorRT-LLM's {adapter.trtllm_base_class} has no pipeline parallelism: it builds the embedding, "
            "ln_f and lm_head on every stage (or uses them there) and never sends hidden states between stages "
            f"(tensorrt_llm/models/{adapter.trtllm_module}/model.py), so pp_size {pp_size} cannot be built",
            "use --pp_size 1 (tensor parallelism works)"))
    if layers and pp_size > layers:
        out.append(Finding("pp-layers", ERROR, f"pp_size {pp_size} exceeds the {layers} layers", f"use pp_size <= {layers}"))
    elif layers and layers % pp_size:
        out.append(Finding("pp-layers", WARNING, f"{layers} layers do not divide by pp_size {pp_size}: the first "
                           f"{layers % pp_size} stage(s) take one extra layer (Mapping.pp_layers); TensorRT-LLM's "
                           "Python GenerationSession asserts an even split", "prefer a pp_size that divides the layer count"))
    if adapter is not None:
        out += [Finding("engine-tp-unconfirmed", WARNING, problem, fix)
                for problem, fix in adapter.parallel_warnings(hf, tp_size)]
    return out
