"""tensorrt_llm/models/modeling_utils.py: configs, loading and the causal-LM forward (1.2.0rc2).

* ``PretrainedConfig.__init__``: keyword-only; ``architecture``, ``dtype``, ``hidden_size``,
  ``num_hidden_layers``, ``num_attention_heads`` required; a ``mapping`` dict becomes a
  ``Mapping``; unknown keys are set as attributes ("Implicitly setting").
* ``PretrainedConfig.from_dict``: ``MODEL_MAP[config["architecture"]]`` (a plain subscript:
  KeyError for an unknown name), then ``getattr(model_cls, "config_class", PretrainedConfig)``.
* ``PretrainedModel.from_checkpoint``: ``rank{N}.safetensors``, ``cls(config)``, ``load``.
* ``PretrainedModel.load``: every parameter without a value is required ("Required but
  not provided tensors"); ``lm_head.weight`` is excused when a ``vocab_embedding.weight`` is
  given; extra tensors only warn ("Provided but not required tensors"); shapes asserted.
* ``DecoderLayerList``: layers ``mapping.pp_layers(num_hidden_layers)``; optional kwargs
  (``spec_decoding_params``, ``position_ids``, ...) go to a layer only when not None.
* ``DecoderModelForCausalLM.forward``: ``spec_decoding_params`` goes to the transformer only
  when not None; last pipeline stage: ``lm_head``, mark ``logits``, return
  ``(logits, hidden_states, all_hidden_states)`` with a paged KV cache (or no cache) and
  ``(logits, presents, hidden_states)`` without; other stages mark ``hidden_states_output``.
"""

import copy
import dataclasses
import json
import os

import torch

from .. import CALLS
from .._utils import get_init_params
from ..functional import Tensor, default_net, rotary_scaling_type
from ..layers.attention import KeyValueCacheParams, PositionEmbeddingType
from ..logger import logger
from ..mapping import Mapping
from ..module import Module, ModuleList
from ..parameter import Parameter


class SpeculativeDecodingMode:
    NONE = "none"
    DRAFT_TOKENS_EXTERNAL = "draft_tokens_external"
    MEDUSA = "medusa"
    LOOKAHEAD_DECODING = "lookahead_decoding"
    EXPLICIT_DRAFT_TOKENS = "explicit_draft_tokens"
    EAGLE = "eagle"

    @classmethod
    def from_arguments(cls, args):
        return args.speculative_decoding_mode or cls.NONE


@dataclasses.dataclass
class QuantConfig:
    """models/modeling_utils.py ``QuantConfig``: a dataclass, ``from_dict`` is ``cls(**config)`` - an unknown key
    raises TypeError - and ``exclude_modules`` None means "the defaults" while an empty list stays empty."""

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int = 128
    smoothquant_val: float = 0.5
    clamp_val: list | None = None
    use_meta_recipe: bool = False
    has_zero_point: bool = False
    pre_quant_scale: bool = False
    exclude_modules: list | None = None
    mamba_ssm_cache_dtype: str | None = None

    @classmethod
    def from_dict(cls, config: dict) -> "QuantConfig":
        return cls(**config)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class PretrainedConfig:
    def __init__(self, *, architecture, dtype, hidden_size, num_hidden_layers, num_attention_heads, vocab_size=None,
                 hidden_act="gelu", logits_dtype="float32", norm_epsilon=1e-5,
                 position_embedding_type=PositionEmbeddingType.learned_absolute, max_position_embeddings=None,
                 rotary_embedding_dim=None, num_key_value_heads=None, intermediate_size=None, mapping=None,
                 quantization=None, use_parallel_embedding=False, embedding_sharding_dim=0, head_size=None,
                 qk_layernorm=False, runtime_defaults=None, **kwargs):
        self.architecture = architecture
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.logits_dtype = logits_dtype
        self.norm_epsilon = norm_epsilon
        self.position_embedding_type = PositionEmbeddingType.from_string(position_embedding_type)
        self.max_position_embeddings = max_position_embeddings
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.head_size = head_size or hidden_size // num_attention_heads
        self.rotary_embedding_dim = rotary_embedding_dim or kwargs.get(
            "rotary_dim", int(self.head_size * kwargs.get("rotary_pct", 1.0)))
        if mapping is None:
            mapping = Mapping()
        elif isinstance(mapping, dict):
            mapping = Mapping(**mapping)
        self.mapping = mapping
        if quantization is None:
            quantization = QuantConfig()
        elif isinstance(quantization, dict):
            quantization = QuantConfig.from_dict(quantization)
        self.quantization = quantization
        self.use_parallel_embedding = use_parallel_embedding
        self.embedding_sharding_dim = embedding_sharding_dim
        self.qk_layernorm = qk_layernorm
        self.runtime_defaults = runtime_defaults
        for key, value in kwargs.items():
            logger.info(f"Implicitly setting {type(self).__name__}.{key} = {value}")
            setattr(self, key, value)
        # not upstream: lets a test see which implicitly set keys the build route ever reads
        self.__dict__["_implicit"] = frozenset(kwargs)
        CALLS.append(("config_implicit", tuple(sorted(kwargs))))

    def __getattribute__(self, name):
        d = object.__getattribute__(self, "__dict__")
        if name in d.get("_implicit", ()):
            CALLS.append(("config_read", name))
        return object.__getattribute__(self, name)

    @property
    def quant_mode(self):
        return None

    def set_if_not_exist(self, key, value):
        if not hasattr(self, key):
            setattr(self, key, value)

    def set_rank(self, rank):
        self.mapping.rank = rank

    def to_dict(self):
        out = copy.deepcopy({k: v for k, v in self.__dict__.items()
                             if k not in ("mapping", "_implicit", "quantization")})
        out["mapping"] = self.mapping.to_dict()
        out["quantization"] = self.quantization.to_dict()
        return out

    @classmethod
    def from_dict(cls, config):
        from . import MODEL_MAP

        model_cls = MODEL_MAP[config["architecture"]]
        config_cls = getattr(model_cls, "config_class", cls)
        return config_cls(**config)

    @classmethod
    def from_json_file(cls, config_file):
        with open(config_file) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_checkpoint(cls, ckpt_dir):
        return cls.from_json_file(os.path.join(ckpt_dir, "config.json"))


def preprocess_weights(weights, model_config):
    """modeling_utils.py ``preprocess_weights`` at load: ``kv_cache_rcp_scaling_factor = 1 / scale`` where a
    ``kv_cache_scaling_factor`` lacks it (``process_kv_scaling_factor``); FP8: int8 weights viewed as
    float8_e4m3fn, and ``lm_head`` scales dropped when ``lm_head.weight`` is not FP8; W8A16 / W4A16:
    ``weight_only_quantize_dict`` with the checkpoint's ``exclude_modules`` (matched on tensor names)."""
    import torch

    from ..quantization.functional import mixed_gemm_layout, weight_only_quantize_dict

    # process_kv_scaling_factor: ModelOpt's separate k and v cache scales become one, their max
    for name in [n for n in weights if n.endswith("k_cache_scaling_factor")]:
        v_name = name.replace("k_cache_scaling_factor", "v_cache_scaling_factor")
        assert v_name in weights, f"{v_name} is missing"
        weights[name.replace("k_cache_scaling_factor", "kv_cache_scaling_factor")] = torch.max(
            weights.pop(name), weights.pop(v_name))
    for name in [n for n in weights if n.endswith("kv_cache_scaling_factor")]:
        rcp = name.replace("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor")
        weights.setdefault(rcp, torch.reciprocal(weights[name]))
    quant = model_config.quantization
    algo = quant.quant_algo
    if algo == "FP8":
        for name, w in list(weights.items()):
            if name.endswith("weight") and w.dtype == torch.int8:
                weights[name] = w.view(torch.float8_e4m3fn)
        if "lm_head.weight" in weights and weights["lm_head.weight"].dtype != torch.float8_e4m3fn:
            weights.pop("lm_head.weights_scaling_factor", None)
            weights.pop("lm_head.activation_scaling_factor", None)
    elif algo == "W4A16_AWQ":
        # preprocess_perlayer_weights: every int8 weight (ModelOpt's [out / 2, in], two int4 codes a byte along the
        # output rows) transposed, through preprocess_weights_for_mixed_gemm (quint4x2; the opaque layout of
        # quantization/functional.py) and viewed as the model dtype: [in, out / 4]; the groupwise scales transposed
        # to [in / group, out] in the model dtype; a pre-quant scale reshaped to [1, in] (of a 2-D one, row 0)
        model_dtype = torch.bfloat16 if model_config.dtype == "bfloat16" else torch.float16
        for name, w in list(weights.items()):
            if name.endswith("weight") and w.dtype == torch.int8:
                weights[name] = mixed_gemm_layout(w.transpose(-1, -2).contiguous()).view(model_dtype)
            if name.endswith("weights_scaling_factor"):
                weights[name] = w.transpose(-1, -2).contiguous().to(getattr(torch, model_config.dtype))
            if name.endswith("prequant_scaling_factor"):
                weights[name] = (w[0, :] if w.dim() == 2 else w).reshape(1, -1)
    elif algo in ("W8A16", "W4A16"):
        weights = weight_only_quantize_dict(weights, algo, quant.exclude_modules)
    return weights



def to_ootb_moe(model):
    """Every ``MOE`` layer through ``layer.to(MoeOOTB)`` (its own failure, if any, is upstream's); the swapped
    layer is recorded, not put back (forward is symbolic either way)."""
    from ..layers.moe import MOE, MoeOOTB

    for name, layer in list(model.named_modules()):
        if isinstance(layer, MOE):
            layer.to(MoeOOTB)
            CALLS.append(("ootb_moe", name))
    return model


class _PostInitCaller(type):
    """modeling_utils.py PostInitCaller: ``__post_init__`` runs after the outermost ``__init__``."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.__post_init__()
        return obj


class PretrainedModel(Module, metaclass=_PostInitCaller):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def __post_init__(self):
        # quantize(self, self.config.quantization) first (tensorrt_llm/quantization/quantize.py), then
        # optimize_model(use_parallel_embedding=...) -> parallelize_embedding: every Embedding built
        # without a tp_group is rebuilt split across the tensor-parallel ranks
        from ..quantization.quantize import quantize

        quantize(self, self.config.quantization)
        if not self.config.use_parallel_embedding:
            return
        from ..layers.embedding import Embedding

        mapping = self.config.mapping
        for _, module in list(self.named_modules()):
            for name, child in list(module._modules.items()):
                if isinstance(child, Embedding) and child.tp_group is None:
                    # module.__class__(**init_params): the class kept (a WeightOnlyQuantEmbedding stays quantized)
                    params = {**get_init_params(child), "tp_size": mapping.tp_size, "tp_group": mapping.tp_group,
                              "sharding_dim": self.config.embedding_sharding_dim, "tp_rank": mapping.tp_rank}
                    module._modules[name] = type(child)(**params)

    @classmethod
    def from_config(cls, config):
        return cls(config)

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        from safetensors.torch import load_file

        if config is None:
            config = PretrainedConfig.from_json_file(os.path.join(ckpt_dir, "config.json"))
        if rank is not None:
            config.set_rank(rank)
        rank = config.mapping.rank
        path = os.path.join(ckpt_dir, f"rank{rank}.safetensors")
        assert os.path.isfile(path), f"{path} does not exist"
        weights = load_file(path)
        if preprocess_weights_hook is not None:
            weights = preprocess_weights_hook(weights)
        weights = preprocess_weights(weights, config)
        model = cls(config)
        model.load(weights)
        return model

    def load(self, weights, from_pruned=False):
        required = {name for name, p in self.named_parameters() if not p.is_inited()}
        provided = set(weights)
        if any(n.endswith("vocab_embedding.weight") for n in provided):
            required = {n for n in required if not (n.endswith("lm_head.weight") and n not in provided)}
        missing = required - provided
        if missing:
            raise RuntimeError(f"Required but not provided tensors:{missing}")
        extra = provided - required
        if extra:
            logger.warning(f"Provided but not required tensors: {extra}")
        for name, param in self.named_parameters():
            if name in provided:
                try:
                    param.value = weights[name]
                except Exception as e:
                    raise RuntimeError(f"Encounter error '{e}' for parameter '{name}'") from e

    def prepare_inputs(self, max_batch_size=1, max_input_len=1, max_seq_len=2, max_num_tokens=1, use_cache=True,
                       max_beam_width=1, opt_num_tokens=None, prompt_embedding_table_size=0,
                       position_encoding_2d=False, max_draft_len=0, speculative_decoding_draft_tokens_external=False,
                       spec_decoding_is_generation_length_variable=False, gather_context_logits=False,
                       lora_target_modules=None, opt_batch_size=0, num_hidden_layers=None,
                       mrope_rotary_cos_sin_size=None):
        """models/generation_mixin.py prepare_basic_inputs: spec-decoding inputs exist only for
        internal drafts with max_draft_len > 0."""
        CALLS.append(("prepare_inputs", {"max_draft_len": max_draft_len,
                                         "external": speculative_decoding_draft_tokens_external}))
        inputs = {"input_ids": Tensor("input_ids"), "position_ids": Tensor("position_ids"), "use_cache": use_cache,
                  "last_token_ids": Tensor("last_token_ids"), "attention_mask": None,
                  "kv_cache_params": KeyValueCacheParams(), "attention_params": None}
        if not self.config.mapping.is_first_pp_rank():
            inputs["hidden_states"] = Tensor("hidden_states_input")
        if max_draft_len > 0 and not speculative_decoding_draft_tokens_external:
            from ..layers.attention import SpecDecodingParams

            inputs["spec_decoding_params"] = SpecDecodingParams(
                spec_decoding_is_generation_length_variable=spec_decoding_is_generation_length_variable,
                spec_decoding_max_generation_length=max_draft_len + 1,
                spec_decoding_generation_lengths=Tensor("spec_decoding_generation_lengths"),
                spec_decoding_position_offsets=Tensor("spec_decoding_position_offsets"),
                spec_decoding_packed_mask=Tensor("spec_decoding_packed_mask"),
                spec_decoding_use=Tensor("spec_decoding_use"))
        return inputs


def stage_forward(model, input_ids, hidden_states, use_cache, embedding_multiplier=None, **layer_kwargs):
    """The pipeline-stage body LLaMAModel, QWenModel, GPTModel, GemmaModel and FalconModel share
    (their ``forward``): embed on the first stage or ``recv``, the layers, ``ln_f`` on the last
    stage or ``send``. LLaMAModel multiplies the first stage's embeddings by its config's
    ``embedding_multiplier`` (tensorrt_llm/models/llama/model.py ``LLaMAModel.forward``)."""
    from ..functional import recv, send

    mapping = model.mapping
    if mapping.is_first_pp_rank():
        hidden_states = model.vocab_embedding(input_ids)
        if embedding_multiplier is not None:
            hidden_states = hidden_states * embedding_multiplier
    else:
        hidden_states = recv(hidden_states, mapping.prev_pp_rank())
    out = model.layers.forward(hidden_states, use_cache=use_cache, **layer_kwargs)
    hidden_states, presents = out if use_cache else (out, None)
    if mapping.is_last_pp_rank():
        hidden_states = model.ln_f(hidden_states)
    else:
        hidden_states = send(hidden_states, mapping.next_pp_rank())
    return (hidden_states, presents) if use_cache else hidden_states


def add_learned_positions(position_embedding, input_ids, position_ids):
    """``hidden_states + position_embedding(position_ids)`` as GPTModel and OPTModel add it (tensorrt_llm/models/
    {gpt,opt}/model.py): one position id per packed token, or the add fails (TensorRT's elementwise layer cannot
    broadcast [tokens, hidden] with [ids, hidden]; a single id is broadcast to every token); the ids are recorded
    when they carry values."""
    position_embedding(position_ids)
    ids, tokens = getattr(position_ids, "value", None), getattr(input_ids, "value", None)
    if ids is not None and tokens is not None:
        if ids.shape[0] == 1:  # TensorRT broadcasts a dimension of size 1: every token gets that row
            ids = ids.expand(tokens.shape[0])
        if ids.shape[0] != tokens.shape[0]:
            raise ValueError(f"position_embedding(position_ids) has {ids.shape[0]} rows, the token "
                             f"embeddings {tokens.shape[0]}: the add cannot broadcast them")
        CALLS.append(("position_ids", tuple(int(v) for v in ids)))


def single_stage_forward(model, hidden_states, use_cache, **layer_kwargs):
    """The body of the Phi, Phi-3, GPT-NeoX, Bloom and MPT models, which have no pipeline stages
    (no recv/send): the layers, then ``ln_f`` on whatever rank this is."""
    out = model.layers.forward(hidden_states, use_cache=use_cache, **layer_kwargs)
    hidden_states, presents = out if use_cache else (out, None)
    hidden_states = model.ln_f(hidden_states)
    return (hidden_states, presents) if use_cache else hidden_states


def prenorm_block(layer, hidden_states, use_cache, residual_multiplier=None, **attention_kwargs):
    """The sequential pre-norm body of the LLaMA, QWen, GPT, Gemma, Phi-3, Bloom and MPT decoder
    layers: ``h + attention(input_layernorm(h))``, then ``+ mlp(post_layernorm(.))``; with a cache
    the attention returns ``(out, present)`` and so does the layer. LLaMADecoderLayer multiplies the
    attention and the MLP outputs by ``config.residual_multiplier`` before each add on its default
    path (tensorrt_llm/models/llama/model.py ``LLaMADecoderLayer.forward``; the reduce_fusion,
    norm_quant_fusion and pp_reduce_scatter paths do not, which the stand-in does not model)."""
    out = layer.attention(layer.input_layernorm(hidden_states), use_cache=use_cache, **attention_kwargs)
    out, present = out if use_cache else (out, None)
    scale = (lambda t: t * residual_multiplier) if residual_multiplier is not None else (lambda t: t)
    hidden_states = hidden_states + scale(out)
    hidden_states = hidden_states + scale(layer.mlp(layer.post_layernorm(hidden_states)))
    return (hidden_states, present) if use_cache else hidden_states


def lm_head_for(config, bias=False, every_stage=False):
    """``ColumnLinear(hidden, pad_vocab_size(vocab, tp), gather_output=True)``; families with
    pipeline stages build it on the last one only."""
    from .._utils import pad_vocab_size
    from ..layers.linear import ColumnLinear

    if not (every_stage or config.mapping.is_last_pp_rank()):
        return None
    return ColumnLinear(config.hidden_size, pad_vocab_size(config.vocab_size, config.mapping.tp_size), bias=bias,
                        dtype=config.dtype, tp_size=config.mapping.tp_size, gather_output=True)


class DecoderLayerList(ModuleList):
    def __init__(self, cls, config):
        layer_list = config.mapping.pp_layers(config.num_hidden_layers)
        super().__init__([cls(config, idx) for idx in layer_list])
        self.layer_list = layer_list

    def forward(self, hidden_states, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, mrope_params=None, position_ids=None, lora_params=None,
                spec_decoding_params=None, vision_token_mask=None):
        presents = []
        for layer in self:
            kwargs = {}
            if position_ids is not None:
                kwargs["position_ids"] = position_ids
            if lora_params is not None:
                kwargs["lora_layer_params"] = lora_params
            if spec_decoding_params is not None:
                kwargs["spec_decoding_params"] = spec_decoding_params
            if mrope_params is not None:
                kwargs["mrope_params"] = mrope_params
            out = layer(hidden_states, use_cache=use_cache, attention_mask=attention_mask,
                        kv_cache_params=kv_cache_params, attention_params=attention_params, **kwargs)
            if use_cache:
                hidden_states, present = out
                presents.append(present)
            else:
                hidden_states = out
        return (hidden_states, tuple(presents)) if use_cache else hidden_states


class DecoderModelForCausalLM(PretrainedModel):
    def __init__(self, config, transformer, lm_head):
        super().__init__(config)
        self.transformer = transformer
        self.lm_head = lm_head
        # layers/attention.py Attention.create_attention_const_params: the RoPE tables every layer
        # uses are built once, on this model, from getattr(config, "rotary_base", 10000.0),
        # getattr(config, "rotary_scaling", None), config.rotary_dim or head_size x
        # getattr(config, "rotary_pct", 1.0) (and rope_local_base_freq for local layers);
        # created with values, so never required by load
        # (its rotary_scaling is parsed as Attention.__init__ parses it: functional.rotary_scaling_type)
        if str(config.position_embedding_type).startswith(("rope", "long_rope")):
            dim = getattr(config, "rotary_dim", None) or int(config.head_size * getattr(config, "rotary_pct", 1.0))
            scaling = getattr(config, "rotary_scaling", None)
            scale_type, scale = rotary_scaling_type(scaling)
            self.rotary_tables = {"base": getattr(config, "rotary_base", 10000.0), "scaling": scaling,
                                  "scale_type": scale_type, "scale": scale, "dim": dim,
                                  "local_base": getattr(config, "rope_local_base_freq", None)}
            self.rotary_inv_freq = Parameter(value=torch.zeros(dim // 2), is_buffer=True)

    def forward(self, input_ids, position_ids=None, use_cache=False, last_token_ids=None, attention_mask=None,
                kv_cache_params=None, attention_params=None, mrope_params=None, hidden_states=None,
                prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None, lora_params=None,
                spec_decoding_params=None):
        kwargs = {"input_ids": input_ids, "position_ids": position_ids, "use_cache": use_cache,
                  "attention_mask": attention_mask, "kv_cache_params": kv_cache_params,
                  "attention_params": attention_params}
        for key, value in (("lora_params", lora_params), ("hidden_states", hidden_states),
                           ("prompt_embedding_table", prompt_embedding_table), ("prompt_tasks", prompt_tasks),
                           ("prompt_vocab_size", prompt_vocab_size), ("spec_decoding_params", spec_decoding_params),
                           ("mrope_params", mrope_params)):
            if value is not None:
                kwargs[key] = value
        out = self.transformer.forward(**kwargs)
        presents = None
        if use_cache:
            out, presents = out
        paged = default_net().plugin_config.paged_kv_cache
        if self.config.mapping.is_last_pp_rank():
            all_hidden_states = out
            gathered = Tensor(f"gather_last_token({out.name})", out.value)
            lm_logits = self.lm_head(gathered)
            if hasattr(self.config, "output_multiplier_scale"):  # LLaMAConfig (Granite's 1 / logits_scaling)
                lm_logits = lm_logits * self.config.output_multiplier_scale
            lm_logits.mark_output("logits", self.config.logits_dtype)
            if use_cache and not paged:
                return lm_logits, presents, gathered
            return lm_logits, gathered, all_hidden_states
        out.mark_output("hidden_states_output", self.config.dtype)
        return (out, presents) if use_cache and not paged else out

