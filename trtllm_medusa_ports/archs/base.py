"""What a base-model family adapter declares (``ArchAdapter``).

An adapter is mostly data: a config mapping (HF config.json -> TensorRT-LLM
config.json fields), a weight table (role -> HF name, over the shared ``ROLES``
table of TensorRT-LLM names and splits, plus the family's deviations: fused
layouts, value transforms, biases), a position embedding, and the semantics the CPU
reference executor needs (norm, MLP, residual layout, ...), which it derives
from the *TensorRT-LLM* config so that verification reads only the artifact.

The vocabulary lives beside it: archs/weights.py (roles, rules, combines), archs/semantics.py
(``Semantics`` and its kinds), archs/experts.py (MoE pieces), archs/registry.py (the registry).
A new family subclasses the closest existing adapter and overrides the few
hooks where it differs (see docs/porting-guide.md).
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.experts import (
    EXPERT_COUNT_KEYS,
    expert_count,
    experts_per_token,
    moe_config,
)
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import (
    BIAS_SPLIT,
    LLAMA_NAMES,
    ROLES,
    Deviation,
    Place,
    Role,
    Source,
    WeightRule,
    first_tensor,
    separate_qkv,
)
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.files.jsonfile import is_int

#: config.json keys every TensorRT-LLM class reads: ``PretrainedConfig``'s fields, and the RoPE fields
#: ``Attention.create_attention_const_params`` reads from any config (tensorrt_llm/models/modeling_utils.py,
#: tensorrt_llm/layers/attention.py); ``model_type`` is this project's record of the family
COMMON_CONFIG_KEYS = frozenset({
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_size",
    "intermediate_size", "vocab_size", "max_position_embeddings", "hidden_act", "norm_epsilon",
    "position_embedding_type", "rotary_base", "rotary_scaling", "rotary_pct", "rotary_dim", "model_type",
})


class ArchAdapter:
    """Base adapter: a Llama-shaped decoder. Families override class data and a few hooks."""

    #: HF ``architectures[0]`` names this adapter serves (the registry keys)
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    #: TensorRT-LLM's PyTorch backend for each of ``hf_architectures`` (archs/pytorch_backend.py): its class and
    #: how it serves an EAGLE-3 draft; every family declares its own (tests/test_pytorch_backend.py)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {}
    #: short family name, also ``--model_type`` and the HF ``model_type`` values it accepts
    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: the README family table (trtllm_medusa_ports/families.py renders it; every registered class
    #: declares its own): a note after the names, the position embedding in words, and what
    #: TensorRT-LLM 1.2.x can serve and how
    display_note: ClassVar[str] = ""
    position_summary: ClassVar[str] = ""
    medusa_status: ClassVar[str] = ""
    #: a tiny random model of the family (Hugging Face config kwargs with ``model_type``), declared by
    #: the class that serves ``hf_architectures[0]``; tests and the demo build it
    tiny_config: ClassVar[dict | None] = None
    #: what the class's own ``engine_limits`` refuses, in words with the upstream file (each class declares its
    #: own; docs/compatibility-rules.md lists them, rendered by trtllm_medusa_ports/families.py)
    engine_limits_summary: ClassVar[str] = ""
    #: the family's test data, read by every family-wide test (each class declares its own; see
    #: :func:`family_test_cases`): shapes beyond the tiny default (``tiny_config`` overrides: GQA/MQA,
    #: tied/untied, biases), each converted and verified at tp 1 and 2 in the test dtypes
    test_variants: ClassVar[tuple[dict, ...]] = ()
    #: non-default values of the config keys the adapter writes (HF names), which the tests read back from
    #: the reference semantics and from the engine class: a key written under another name fails.
    #: None: not checked that way
    key_cases: ClassVar[dict | None] = None
    #: verified at pp 2 too (a family whose layers depend on the global layer index, or whose class sends
    #: hidden states between stages); classes without pipeline parallelism are tested for the refusal
    pipeline_test: ClassVar[bool] = False
    #: how much the real-magnitude test adds to the tiny model's norm weights (tests/test_magnitudes.py): large
    #: enough that float16 and bfloat16 rounding matter, small enough that the tiny model's hidden states stay
    #: inside float16. A family whose MLP squares its input (Nemotron's squared ReLU) reaches float16's
    #: range at a smaller gain
    magnitude_test_norm_offset: ClassVar[float] = 1000.0
    #: the error rules ``check`` gives the family's tiny model (and so its tests convert it with
    #: ``--allow_unsupported``): ALiBi, attention soft-capping, ...; empty: servable
    expected_check_errors: ClassVar[frozenset[str]] = frozenset()
    #: the family's limits, tested: changes to ``tiny_config`` (HF keys, dotted paths allowed) and the error rule
    #: ``check`` gives each (``engine-class-limit`` for ``engine_limits``, ``engine-divergence``, ``port-limit``,
    #: ...): a family-wide test builds each base and checks it
    check_cases: ClassVar[tuple[tuple[dict, str], ...]] = ()
    #: where upstream's own converter for the family lives (repository NVIDIA/TensorRT-LLM): the mapping this
    #: adapter restates and its tests compare with (declared by each class that declares ``tiny_config``)
    upstream_converter: ClassVar[str] = ""
    #: TensorRT-LLM 1.2.x class the engine derives from (tensorrt_llm/models/__init__.py MODEL_MAP)
    trtllm_base_class: ClassVar[str] = ""
    #: the architecture name the TensorRT-LLM class keys its variant on (``PretrainedConfig.architecture``), where
    #: it is not the HF name: written as the checkpoint's ``base_architecture`` (:meth:`base_architecture`), which
    #: the engine's config hands the class and the runtime looks up in ``MODEL_MAP``
    engine_architecture: ClassVar[str | None] = None
    #: True when upstream MedusaForCausalLM (tensorrt_llm/models/medusa/model.py) builds this base
    #: correctly as it is (it only knows LLaMAForCausalLM and QWenForCausalLM)
    upstream_medusa_base: ClassVar[bool] = False
    #: True when upstream's decoder layers pass spec_decoding_params to Attention
    upstream_spec_decoding_plumbing: ClassVar[bool] = False
    #: the config.json keys ``trtllm_base_class`` reads beyond :data:`COMMON_CONFIG_KEYS` (its config class's
    #: fields and the attributes its layers read): whatever else a family writes - a key its parent family's
    #: class reads, say - is dropped by ``engine_config`` (declared by the class that names a new engine class)
    engine_keys: ClassVar[frozenset[str]] = frozenset()
    #: folder of ``trtllm_base_class`` under tensorrt_llm/models/ (its 1.2.x module is ``.model``)
    trtllm_module: ClassVar[str] = ""
    #: False when the TensorRT-LLM class cannot run pipeline-parallel (no send/recv between stages)
    engine_pipeline_parallel: ClassVar[bool] = True
    #: whether upstream's family has a config class of its own (``<Family>Config``, the model class's
    #: ``config_class``); False: the class takes ``PretrainedConfig`` (GPT-NeoX, Bloom, MPT, OPT), so our engine
    #: class must not subclass one (the stand-in's MODEL_MAP is checked against these declarations)
    upstream_config_class: ClassVar[bool] = True
    #: TensorRT-LLM ``position_embedding_type`` the family writes (a config may still override it)
    position_embedding: ClassVar[PositionEmbedding] = PositionEmbedding.ROPE_GPT_NEOX
    #: the Hugging Face config class's defaults of the keys read with a fallback (``hf_value``): config.json
    #: written by ``save_pretrained`` leaves out values equal to them, so a missing ``tie_word_embeddings``
    #: means True for Cohere and False for Llama. Each family class declares its own (a test compares them
    #: with transformers' config class); a key read without a declared default fails loudly
    hf_defaults: ClassVar[dict] = {}
    #: the config.json key of the norms' epsilon; None where the config has none and the norms are built with their
    #: module's own default (``fixed_norm_epsilon``: DBRX's bias-free ``nn.LayerNorm`` keeps 1e-5)
    norm_epsilon_key: ClassVar[str | None] = "rms_norm_eps"
    fixed_norm_epsilon: ClassVar[float | None] = None
    #: the config.json key of RoPE's base (``rope_theta``: read from transformers 5's ``rope_parameters`` too) and
    #: of an MoE's expert count and top-k; a path into a nested object where the family keeps them there (DBRX's
    #: ``attn_config.rope_theta``, ``ffn_config.moe_num_experts``, ``ffn_config.moe_top_k``). Family-wide tests
    #: read ``key_cases`` through these names
    rope_theta_key: ClassVar[str] = "rope_theta"
    expert_count_keys: ClassVar[tuple[str, ...]] = EXPERT_COUNT_KEYS
    experts_per_token_key: ClassVar[str] = "num_experts_per_tok"
    #: the config.json keys of the context length (GPT-2: ``n_positions``) and of the activation (GPT-2 and
    #: GPTBigCode: ``activation_function``); a family default comes from ``hf_defaults``, never a silent guess
    max_positions_key: ClassVar[str] = "max_position_embeddings"
    activation_key: ClassVar[str] = "hidden_act"
    #: the prefix of the Hugging Face decoder layers' tensor names (``{i}``: the layer index), written once
    layer_prefix: ClassVar[str] = "model.layers.{i}."
    #: where the family's Hugging Face names differ from :data:`LLAMA_NAMES` (layer roles relative to
    #: ``layer_prefix``; None: the family has no such tensor). Merged down the class hierarchy: a family
    #: written as "X, except ..." lists only its exceptions
    names: ClassVar[dict[Role, Source | None]] = {}
    #: the family's weight table, role -> full HF source, made from ``LLAMA_NAMES``, ``names`` and
    #: ``layer_prefix`` when the class is defined (see ``Role`` and the shared ``ROLES``); the rules
    #: come from it, with the family's ``biased_roles`` and ``deviations``
    weights: ClassVar[dict[Role, Source]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        parent = cls.__mro__[1]
        if cls.trtllm_base_class != getattr(parent, "trtllm_base_class", "") and "engine_keys" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} builds on {cls.trtllm_base_class} (its parent on "
                            f"{getattr(parent, 'trtllm_base_class', '')}): declare the engine_keys that class reads")
        if "weights" in cls.__dict__:
            raise TypeError(f"{cls.__name__} defines weights: declare names (and layer_prefix) instead")
        if cls.norm_epsilon_key is None and cls.fixed_norm_epsilon is None:
            raise TypeError(f"{cls.__name__} reads no norm epsilon key: declare fixed_norm_epsilon, the epsilon its "
                            "norms are built with (the module's default, e.g. nn.LayerNorm's 1e-5)")
        merged: dict = dict(LLAMA_NAMES)
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("names", {}))
        cls.weights = {role: cls.layer_name(src) if ROLES[role].place is Place.LAYER else src
                       for role, src in merged.items() if src is not None}

    @classmethod
    def layer_name(cls, source: Source) -> Source:
        """A layer-relative name (or q/k/v triple) with the family's ``layer_prefix``."""
        return tuple(cls.layer_prefix + s for s in source) if isinstance(source, tuple) else cls.layer_prefix + source
    #: HF names tried for lm_head after ``weights[Role.LM_HEAD]`` (tied embeddings come last)
    lm_head_fallbacks: ClassVar[tuple[str, ...]] = ()
    #: True for families whose real models overflow float16 (check warns on --dtype float16)
    float16_unsafe: ClassVar[bool] = False
    #: regexes of transformers' parameter names the checkpoint stores in float32 whatever its dtype (a rule's
    #: ``dtype``): verify and calibration compute with them unrounded, as the engine does
    full_precision_parameters: ClassVar[tuple[str, ...]] = ()
    #: MoE expert weights whose transformers names alone do not say their role (quant/emulate.py's weight-only
    #: emulation knows transformers 5's ``gate_up_proj`` / ``down_proj``, Mixtral's, Qwen's and Granite's): leaf
    #: name -> (``"fc"`` or ``"proj"``, stored transposed: ``[experts x in, out]``, multiplied as ``x @ w``)
    expert_weight_leaves: ClassVar[dict[str, tuple[str, bool]]] = {}
    #: HF tensor names that are not weights (buffers some checkpoints carry)
    ignored_hf_tensors: ClassVar[tuple[str, ...]] = (r".*rotary_emb\.inv_freq", r"medusa_head\..*")

    # -- config ---------------------------------------------------------------------------
    def hf_value(self, hf: HFConfig, key: str):
        """``key`` of config.json, or the family's declared default for it (``hf_defaults``)."""
        value = hf.get(key)
        if value is not None:
            return value
        if key not in self.hf_defaults:
            raise AssertionError(f"{type(self).__name__} reads {key!r} with no default of its own: add it to its "
                                 "hf_defaults (the Hugging Face config class's default)")
        return self.hf_defaults[key]

    def norm_epsilon(self, hf: HFConfig) -> float:
        """The norms' epsilon: config.json's ``norm_epsilon_key`` (or the family's default for it), or, for a config
        with no such key, the epsilon the family's norm modules are built with (``fixed_norm_epsilon``)."""
        if self.norm_epsilon_key is None:
            return float(self.fixed_norm_epsilon)
        return float(self.hf_value(hf, self.norm_epsilon_key))

    def rotary_base(self, hf: HFConfig) -> float:
        """RoPE's base: ``rope_theta`` wherever transformers keeps it (``rope_parameters`` or the top level), or the
        family's own key (``rope_theta_key``: DBRX's ``attn_config.rope_theta``, with its config class's default)."""
        if self.rope_theta_key == "rope_theta":
            return hf.rope_theta
        return float(self.hf_value(hf, self.rope_theta_key))

    def rotary_fraction(self, hf: HFConfig) -> float:
        """The share of each head RoPE rotates, with the family's default where config.json leaves it out
        (``hf_defaults["partial_rotary_factor"]`` for a config class whose default is not 1; a test compares it
        with transformers')."""
        return hf.partial_rotary_factor(self.hf_defaults.get("partial_rotary_factor", 1.0))

    def require_sizes(self, hf: HFConfig) -> None:
        """The sizes every conversion reads, from config.json itself, naming a missing field; checked before
        the weights are compared with the shapes transformers builds (which would fill in its own defaults)."""
        self.hidden_size(hf)
        self.num_attention_heads(hf)
        self.num_hf_layers(hf)
        hf.require("vocab_size")
        self.top_k(hf)  # an MoE's expert count and top-k, typed and in range (0 for a dense family)

    def hidden_size(self, hf: HFConfig) -> int:
        return int(hf.require("hidden_size", int, "n_embd", "d_model"))

    def num_attention_heads(self, hf: HFConfig) -> int:
        return int(hf.require("num_attention_heads", int, "n_head", "n_heads"))

    def num_kv_heads(self, hf: HFConfig) -> int:
        return int(hf.get("num_key_value_heads") or self.num_attention_heads(hf))

    def head_size(self, hf: HFConfig) -> int:
        explicit = hf.get("head_dim")
        if isinstance(explicit, int) and explicit > 0:
            return explicit
        hidden = self.hidden_size(hf)
        heads = self.num_attention_heads(hf)
        if hidden % heads:
            raise ModelError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no head_dim is given",
                where=str(hf.path),
                fix="add head_dim to config.json",
            )
        return hidden // heads

    def trtllm_config(self, hf: HFConfig) -> dict:
        """The family's fields of TensorRT-LLM's config.json (no Medusa, dtype or mapping keys)."""
        return {
            "num_hidden_layers": self.num_hf_layers(hf),
            "num_attention_heads": self.num_attention_heads(hf),
            "num_key_value_heads": self.num_kv_heads(hf),
            "hidden_size": self.hidden_size(hf),
            "head_size": self.head_size(hf),
            "intermediate_size": self.intermediate_size(hf),
            "vocab_size": hf.require("vocab_size"),
            "max_position_embeddings": self.max_positions(hf),
            "hidden_act": self.activation(hf),
            "norm_epsilon": self.norm_epsilon(hf),
            "position_embedding_type": self.position_embedding.value,
            **({"rotary_base": self.rotary_base(hf), "rotary_scaling": self.rotary_scaling(hf)}
               if self.position_embedding.is_rope else {}),
            "model_type": self.family,
        }

    def rotary_scaling(self, hf: HFConfig) -> dict | None:
        """The checkpoint's ``rotary_scaling``: config.json's scaling with its null options left out (the engine reads
        each with a default, ``.get(key, default)``, which a null would defeat); for YaRN with the original length
        the engine reads from it (tensorrt_llm/layers/attention.py ``create_attention_const_params``: 4096 without),
        where config.json writes it at the top level, as transformers reads it."""
        scaling = hf.rope_scaling
        if not scaling:
            return scaling
        out = {k: v for k, v in scaling.items() if v is not None}
        if out.get("type") == "yarn" and "original_max_position_embeddings" not in out \
                and hf.rope_original_max_positions is not None:
            out["original_max_position_embeddings"] = hf.rope_original_max_positions
        return out

    def engine_config(self, hf: HFConfig) -> dict:
        """:meth:`trtllm_config` restricted to the keys the engine class reads (:data:`COMMON_CONFIG_KEYS` and
        ``engine_keys``): what the checkpoint's config.json holds of the family."""
        keep = COMMON_CONFIG_KEYS | self.engine_keys
        return {k: v for k, v in self.trtllm_config(hf).items() if k in keep}

    def max_positions(self, hf: HFConfig) -> int:
        """The context length from config.json's ``max_positions_key``, or the family's declared default; a
        config with neither fails, naming the key (it was silently 2048 before)."""
        value = hf.get(self.max_positions_key)
        if value is None:
            value = self.hf_defaults.get(self.max_positions_key)
        if not is_int(value, 1):
            raise ModelError(f"config.json's {self.max_positions_key} is {value!r}: the context length TensorRT-LLM's "
                             "config needs (max_position_embeddings)", where=str(hf.path),
                             fix=f"add {self.max_positions_key} (a positive integer) to config.json")
        return value

    def activation(self, hf: HFConfig) -> str:
        """The base's activation, read from its own key (``activation_key``)."""
        return str(self.hf_value(hf, self.activation_key))

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(hf.require("intermediate_size"))

    def num_experts(self, hf: HFConfig) -> int:
        """Routed experts per MoE layer; 0 for a dense family (one whose engine class reads no ``moe``).
        Qwen's MoE configs say ``num_experts``, Mixtral's and Granite's ``num_local_experts`` (which
        transformers 5 also writes for Qwen3-MoE)."""
        if "moe" not in self.engine_keys:
            return 0
        return expert_count(hf, self.expert_count_keys)

    def expert_field_keys(self, hf: HFConfig) -> tuple[str, str, str] | None:
        """The config.json fields an expert tensor's shape comes from - the expert count, the experts' intermediate
        size, the hidden size - named where the base's weights contradict them; None for a dense family."""
        if "moe" not in self.engine_keys:
            return None
        count = next((k for k in self.expert_count_keys if hf.get(k) is not None), self.expert_count_keys[0])
        inter = "moe_intermediate_size" if hf.get("moe_intermediate_size") is not None else "intermediate_size"
        return count, inter, "hidden_size"

    def top_k(self, hf: HFConfig) -> int:
        """Experts each token is routed to (``experts_per_token_key``, 1 to the expert count); 0 for a dense family."""
        experts = self.num_experts(hf)
        return experts_per_token(hf, experts, self.experts_per_token_key, self.expert_count_keys) if experts else 0

    def moe_block(self, hf: HFConfig, normalization_mode: int, sparse_mixer_epsilon: float = 0.01) -> dict:
        """config.json's ``moe`` for this config's experts (:func:`moe_config`; ``sparse_mixer_epsilon`` for
        SPARSE_MIXER routing)."""
        return moe_config(self.num_experts(hf), self.top_k(hf), normalization_mode, sparse_mixer_epsilon)

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return bool(self.hf_value(hf, "tie_word_embeddings"))

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs the family's TensorRT-LLM class cannot represent."""
        return []

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs TensorRT-LLM's class may serve but *this port* does not convert
        (yet): a feature the adapter, the converter or the reference executor lacks (rule ``port-limit``).
        Engine limits go to :meth:`engine_limits`."""
        return []

    def default_epsilon_limit(self, hf: HFConfig, key: str, norms: str) -> list[tuple[str, str]]:
        """A limit for classes that build ``norms`` with LayerNorm's default epsilon (1e-5)."""
        eps = float(self.hf_value(hf, key))
        if abs(eps - 1e-5) <= 1e-12:
            return []
        return [(f"{key} {eps} differs from the 1e-5 TensorRT-LLM's {self.trtllm_base_class} uses for {norms} "
                 f"(tensorrt_llm/models/{self.trtllm_module}/model.py passes no eps)",
                 f"this base cannot be built exactly by TensorRT-LLM's {self.trtllm_base_class}")]

    def parallel_warnings(self, hf: HFConfig, tp_size: int) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for a tensor-parallel layout whose engine behaviour could not be confirmed
        from the upstream source read (rule ``engine-tp-unconfirmed``, a warning)."""
        return []

    def engine_divergences(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs the engine class *can* build but computes differently
        from Hugging Face (rule ``engine-divergence``, overridable: the reference executor computes
        what the engine computes, so ``verify`` of such a checkpoint fails against transformers)."""
        return []

    def transformers_divergences(self, hf: HFConfig, transformers_version: str) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs where the installed transformers (``transformers_version``) computes this config
        otherwise than the model is (rule ``transformers-divergence``, a warning): the engine is right, but
        ``verify``'s reference side is not the model until the workaround is applied."""
        return []

    def alibi_reason(self, hf: HFConfig) -> str | None:
        """Why this config of the family uses ALiBi (which TensorRT-LLM's XQA lacks), or None."""
        return None

    def exact_gelu(self, hf: HFConfig) -> bool:
        """True when the base computes the exact (erf) GELU, which TensorRT-LLM approximates."""
        return (hf.get("hidden_act") or hf.get("activation")) == "gelu"

    def forced_parallel_embedding(self, tp_size: int) -> bool | None:
        """``use_parallel_embedding`` the family's TensorRT-LLM config class imposes, or None."""
        return None

    # -- weights --------------------------------------------------------------------------
    def weight_sources(self, hf: HFConfig) -> dict[Role, Source]:
        """The weight table for this config (families whose names depend on the config override it)."""
        return dict(self.weights)

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        """Roles whose HF tensors carry a ``.bias`` next to ``.weight``."""
        return frozenset()

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        """Where the family departs from ``ROLES`` (fused layouts, value transforms, names)."""
        return {}

    def rules_at(self, place: Place, hf: HFConfig) -> list[WeightRule]:
        """The weight rules of one place, made from the shared table and this family's entries."""
        sources, biased, deviations = self.weight_sources(hf), self.biased_roles(hf), self.deviations(hf)
        rules = []
        for role, spec in ROLES.items():
            if spec.place is not place or role not in sources:
                continue
            deviation = deviations.get(role, Deviation())
            name = deviation.trtllm_name or spec.trtllm_name
            split = deviation.split or spec.split
            source = sources[role]
            separate = isinstance(source, tuple)
            combine = deviation.combine or (separate_qkv if separate else first_tensor)
            for kind in ("weight", "bias") if role in biased else ("weight",):
                names = tuple(f"{s}.{kind}" for s in source) if separate else (f"{source}.{kind}",)
                alternatives: tuple[tuple[str, ...], ...] = ()
                if role is Role.LM_HEAD and kind == "weight":
                    tied = (f"{sources[Role.EMBEDDING]}.weight",) if self.tied_embeddings(hf) else None
                    alternatives = tuple((f"{n}.weight",) for n in self.lm_head_fallbacks) + ((tied,) if tied else ())
                # a row-parallel layer's bias is added once after the all-reduce: replicated
                part = split if kind == "weight" else deviation.bias_split or BIAS_SPLIT.get(split, split)
                how = combine if kind == "weight" else deviation.bias_combine or combine
                rules.append(WeightRule(f"{name}.{kind}", names, part, how, alternatives))
        return rules

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Rules of one decoder layer; TensorRT-LLM names are relative to ``transformer.layers.{n}.``."""
        return self.rules_at(Place.LAYER, hf)

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the first pipeline stage (vocab_embedding and friends)."""
        return self.rules_at(Place.FIRST, hf)

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the last pipeline stage (ln_f, lm_head)."""
        return self.rules_at(Place.LAST, hf)

    def num_hf_layers(self, hf: HFConfig) -> int:
        return int(hf.require("num_hidden_layers", int, "n_layer", "n_layers"))

    # -- semantics ------------------------------------------------------------------------
    def semantics(self, cfg: dict) -> Semantics:
        """Llama semantics read from the TensorRT-LLM config; families ``replace`` what differs.

        Keys the adapter writes are read without defaults: a key written under another name
        fails here instead of silently taking a default.
        """
        head = int(cfg["head_size"])
        pct = float(cfg.get("rotary_pct", 1.0))  # written by the partial-rotary families only
        position = PositionEmbedding(cfg["position_embedding_type"])
        return Semantics(
            norm=NormKind.RMS,
            norm_epsilon=float(cfg["norm_epsilon"]),
            mlp=MlpKind.GATED,
            hidden_act=cfg["hidden_act"],
            position_embedding=position,
            rotary_dim=int(cfg.get("rotary_dim") or int(head * pct)),
            rotary_base=float(cfg["rotary_base"]) if position.is_rope else 10000.0,
            rotary_scaling=cfg.get("rotary_scaling"),
            sliding_window=cfg.get("sliding_window"),
        )

    # -- naming ---------------------------------------------------------------------------
    def base_architecture(self, hf_architecture: str) -> str:
        """The ``base_architecture`` a checkpoint of this family records: the engine's name for the base
        (``engine_architecture``) where the family declares one, else the HF name the base was saved under."""
        return self.engine_architecture or hf_architecture

    def ported_architecture(self) -> str:
        """Our own ``architecture`` name for checkpoints upstream cannot build as they are.

        Deliberately absent from TensorRT-LLM's MODEL_MAP: plain ``trtllm-build``
        refuses it ("unsupported architecture") instead of building it wrong;
        ``trtllm-medusa build`` registers it first (engine/registry.py).
        """
        return f"MedusaPorts{self.trtllm_base_class}"
