"""A Medusa causal LM over any supported base (TensorRT-LLM 1.2.x network code).

Differences from upstream ``MedusaForCausalLm`` (tensorrt_llm/models/medusa/model.py),
which only wraps ``LLaMAForCausalLM`` / ``QWenForCausalLM``:
* the base is the family's own TensorRT-LLM class, given the spec-decoding plumbing it
  lacks (spec_decoding.py);
* the heads' activation is ``medusa_hidden_act`` from config.json (SiLU, how Medusa heads are
  trained), not the base's ``hidden_act`` (GELU on Gemma, Phi, ...);
* ``medusa_shared_lm_head``: every head projects with the base model's lm_head instead of a
  copy of its own;
* heads exist on the last pipeline stage only (where the converter writes them and where
  ``medusa_logits`` is marked); upstream builds them on every rank;
* bases with learned absolute positions get one position id per tree token, rebuilt from the runtime's one per
  generation request and ``spec_decoding_position_offsets`` (positions.py): upstream's runtime gives none;
* ``load`` refuses tensors the class does not declare. Upstream only warns ("Provided but not
  required tensors", models/modeling_utils.py ``PretrainedModel.load``), which would turn a
  name mismatch between converter and engine class into a silently wrong engine.
Outputs are upstream's: ``logits`` and ``medusa_logits`` ``[heads, tokens, vocab_padded]``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from trtllm_medusa_ports.engine.positions import tree_position_ids
from trtllm_medusa_ports.engine.spec_decoding import add_spec_decoding_plumbing
from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.weights.sharding import Mapping


def _head_class() -> type:
    """TensorRT-LLM's Medusa head, as upstream's ``MedusaHead`` declares it (tensorrt_llm/models/medusa/model.py):
    ResBlocks of a column-parallel linear, then its own lm_head or the base's."""
    functional = import_module("tensorrt_llm.functional")
    layers = import_module("tensorrt_llm.layers")
    module_mod = import_module("tensorrt_llm.module")
    ColumnLinear, Module, ModuleList = layers.ColumnLinear, module_mod.Module, module_mod.ModuleList

    class MedusaLayer(Module):
        def __init__(self, hidden_size: int, act: str, dtype: Any, mapping: Any):
            super().__init__()
            self.act = act
            self.linear = ColumnLinear(hidden_size, hidden_size, bias=True, dtype=dtype,
                                       tp_group=mapping.tp_group, tp_size=mapping.tp_size, gather_output=True)

        def forward(self, x):
            return x + functional.ACT2FN[self.act](self.linear(x))

    class MedusaHead(Module):
        def __init__(self, config: Any, vocab_padded: int, own_lm_head: bool):
            super().__init__()
            act = getattr(config, "medusa_hidden_act", "silu")
            self.medusa_layers = ModuleList(
                [MedusaLayer(config.hidden_size, act, config.dtype, config.mapping)
                 for _ in range(config.num_medusa_layers)])
            self.own_lm_head = own_lm_head
            if own_lm_head:
                self.lm_head = ColumnLinear(config.hidden_size, vocab_padded, bias=False, dtype=config.dtype,
                                            tp_group=config.mapping.tp_group, tp_size=config.mapping.tp_size,
                                            gather_output=True)

        def forward(self, x, shared_lm_head=None):
            for layer in self.medusa_layers:
                x = layer(x)
            return (self.lm_head if self.own_lm_head else shared_lm_head)(x)

    return MedusaHead


def _ported_config(base_config_cls: type) -> type:
    class PortedConfig(base_config_cls):
        """The family's config class, seeing the base's HF architecture.

        Family logic keys on ``architecture`` (GemmaConfig.is_gemma_2 compares it with
        "Gemma2ForCausalLM", tensorrt_llm/models/gemma/config.py), so the checkpoint's
        ``MedusaPorts*`` name is replaced by ``base_architecture`` before the family sees it. The
        engine's config then names a base that upstream's runtime resolves through MODEL_MAP
        (``EngineConfig.from_json_file``), with the Medusa fields (num_medusa_heads,
        max_draft_len, ...) beside it.
        """

        def __init__(self, **kwargs: Any):
            kwargs["architecture"] = kwargs.get("base_architecture") or kwargs["architecture"]
            super().__init__(**kwargs)

    return PortedConfig


def _tree_positions(args: tuple, kwargs: dict, spec: Any) -> tuple:
    """``DecoderModelForCausalLM.forward``'s arguments with the position ids of the tree tokens (learned positions:
    the class reads them on the first stage), whether given positionally (``input_ids, position_ids, ...``) or
    by keyword (changed in ``kwargs``)."""
    args = list(args)
    if len(args) > 1:
        args[1] = tree_position_ids(args[1], spec.spec_decoding_position_offsets)
    else:
        kwargs["position_ids"] = tree_position_ids(kwargs["position_ids"], spec.spec_decoding_position_offsets)
    return tuple(args)


def _refuse_undeclared(model: Any, weights: dict, base_name: str) -> None:
    """A rank file holding tensors the class does not declare is refused (upstream would only warn and build an
    engine without them)."""
    declared = {n for n, _ in model.named_parameters()}
    extra = sorted(set(weights) - declared)
    if extra:
        rank = model.config.mapping.rank
        raise CheckpointError(
            f"rank{rank}.safetensors holds {len(extra)} tensor(s) that {base_name} in this "
            f"TensorRT-LLM does not declare, e.g. {', '.join(extra[:4])}; upstream would only warn "
            "and build an engine without them",
            fix="convert with the trtllm-medusa version that matches this TensorRT-LLM "
                "(trtllm-medusa check lists what each family supports)")


def medusa_class(base_cls: type, *, plumbing_needed: bool, name: str) -> type:
    """Build ``name``: ``base_cls`` + Medusa heads + (if needed) spec-decoding plumbing."""
    functional = import_module("tensorrt_llm.functional")
    ModuleList = import_module("tensorrt_llm.module").ModuleList
    modeling_utils = import_module("tensorrt_llm.models.modeling_utils")
    # some classes have no config_class (tests/standin/LEDGER.md); upstream's PretrainedConfig.from_dict
    # falls back to PretrainedConfig the same way (tensorrt_llm/models/modeling_utils.py)
    base_config_cls = getattr(base_cls, "config_class", modeling_utils.PretrainedConfig)
    MedusaHead = _head_class()

    class PortedMedusaForCausalLM(base_cls):
        def __init__(self, config: Any):
            super().__init__(config)
            if plumbing_needed:
                add_spec_decoding_plumbing(self.transformer)
            self.num_medusa_heads = config.num_medusa_heads
            self.max_medusa_token_len = config.max_draft_len
            self.shared_lm_head = bool(getattr(config, "medusa_shared_lm_head", False))
            # the position table is read on the first stage only (tensorrt_llm/models/gpt/model.py GPTModel)
            pet = config.position_embedding_type
            self.learned_positions = str(getattr(pet, "name", pet)).endswith("learned_absolute")
            if config.mapping.is_last_pp_rank():
                vocab_padded = Mapping(config.mapping.tp_size).padded_vocab(config.vocab_size)
                self.medusa_heads = ModuleList(
                    [MedusaHead(config, vocab_padded, own_lm_head=not self.shared_lm_head)
                     for _ in range(config.num_medusa_heads)])

        def forward(self, *args, **kwargs):
            spec = kwargs.get("spec_decoding_params")
            if self.learned_positions and spec is not None and self.config.mapping.is_first_pp_rank():
                args = _tree_positions(args, kwargs, spec)
            out = super().forward(*args, **kwargs)
            if not kwargs.get("use_cache", False) or not self.config.mapping.is_last_pp_rank():
                return out
            # DecoderModelForCausalLM.forward, last stage: (logits, hidden, all_hidden) with a paged
            # KV cache, (logits, presents, hidden) without (tensorrt_llm/models/modeling_utils.py)
            paged = functional.default_net().plugin_config.paged_kv_cache
            lm_logits, hidden_states = (out[0], out[1]) if paged else (out[0], out[2])
            shared = self.lm_head if self.shared_lm_head else None
            medusa_logits = functional.stack([h(hidden_states, shared) for h in self.medusa_heads], dim=0)
            medusa_logits.mark_output("medusa_logits", self.config.logits_dtype)
            return (medusa_logits,) + tuple(out)

        def prepare_inputs(self, *args, **kwargs):
            # Medusa drafts come from the heads, not from outside the engine, and the tree size is
            # the checkpoint's max_draft_len (as upstream's MedusaForCausalLm.prepare_inputs).
            kwargs["speculative_decoding_draft_tokens_external"] = False
            kwargs["max_draft_len"] = self.max_medusa_token_len
            return super().prepare_inputs(*args, **kwargs)

        def load(self, weights, *args, **kwargs):
            _refuse_undeclared(self, weights, base_cls.__name__)
            return super().load(weights, *args, **kwargs)

    PortedConfig = _ported_config(base_config_cls)
    config_name = name.replace("ForCausalLM", "Config")
    PortedConfig.__name__ = PortedConfig.__qualname__ = config_name
    PortedMedusaForCausalLM.config_class = PortedConfig
    PortedMedusaForCausalLM.__name__ = PortedMedusaForCausalLM.__qualname__ = name
    return PortedMedusaForCausalLM
