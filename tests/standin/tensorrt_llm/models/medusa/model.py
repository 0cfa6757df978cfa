"""tensorrt_llm/models/medusa/{config,model}.py (1.2.0rc3): MedusaConfig and MedusaForCausalLm.

MedusaConfig wraps a QWenConfig when ``model_type`` contains "qwen", else a LLaMAConfig, built
from every other key, and forwards attribute reads to it. MedusaForCausalLm builds a
``GenericMedusaForCausalLM`` over QWenForCausalLM or LLaMAForCausalLM (no other base) and
forwards every attribute to it, so parameter names carry no prefix:
``medusa_heads.{h}.medusa_layers.{l}.linear.{weight,bias}`` and ``medusa_heads.{h}.lm_head.weight``,
on every rank. The heads use the base's ``hidden_act``. ``prepare_inputs`` forces internal drafts
and the config's ``max_draft_len``; ``forward`` marks ``medusa_logits``.
"""

from ..._utils import pad_vocab_size
from ...functional import ACT2FN, default_net, stack
from ...layers import ColumnLinear
from ...module import Module, ModuleList
from ..llama.model import LLaMAConfig, LLaMAForCausalLM
from ..modeling_utils import PretrainedConfig, PretrainedModel
from ..qwen.model import QWenConfig, QWenForCausalLM


class MedusaConfig(PretrainedConfig):
    def __init__(self, *, num_medusa_heads=4, num_medusa_layers=1, max_draft_len=63, **kwargs):
        base = QWenConfig if "qwen" in str(kwargs.get("model_type", "")).lower() else LLaMAConfig
        inner = base(**kwargs)
        inner.num_medusa_heads, inner.num_medusa_layers, inner.max_draft_len = (
            num_medusa_heads, num_medusa_layers, max_draft_len)
        self.__dict__["config"] = inner

    def __getattr__(self, name):
        if "config" not in self.__dict__:  # while copying / unpickling
            raise AttributeError(name)
        return getattr(self.__dict__["config"], name)

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def set_rank(self, rank):
        self.__dict__["config"].set_rank(rank)

    def to_dict(self):
        return self.__dict__["config"].to_dict()


class MedusaLayer(Module):
    def __init__(self, hidden_size, hidden_act, dtype, tp_size):
        super().__init__()
        self.hidden_act = hidden_act
        self.linear = ColumnLinear(hidden_size, hidden_size, dtype=dtype, tp_size=tp_size, gather_output=True)

    def forward(self, x):
        return x + ACT2FN[self.hidden_act](self.linear(x))


class MedusaHead(Module):
    def __init__(self, num_layers, hidden_size, vocab_size, hidden_act, dtype, tp_size):
        super().__init__()
        self.medusa_layers = ModuleList([MedusaLayer(hidden_size, hidden_act, dtype, tp_size)
                                         for _ in range(num_layers)])
        self.lm_head = ColumnLinear(hidden_size, vocab_size, bias=False, dtype=dtype, tp_size=tp_size,
                                    gather_output=True)

    def forward(self, x):
        for layer in self.medusa_layers:
            x = layer(x)
        return self.lm_head(x)


class MedusaForCausalLm(PretrainedModel):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('MedusaForCausalLM', 'MedusaLlamaForCausalLM')

    config_class = MedusaConfig

    def __init__(self, config):
        super().__init__(config)
        base = QWenForCausalLM if "qwen" in str(getattr(config, "model_type", "")) else LLaMAForCausalLM

        class GenericMedusaForCausalLM(base):
            def __init__(self, config):
                super().__init__(config)
                tp = config.mapping.tp_size
                self.num_medusa_heads = config.num_medusa_heads
                self.max_medusa_token_len = config.max_draft_len
                self.medusa_heads = ModuleList([
                    MedusaHead(config.num_medusa_layers, config.hidden_size, pad_vocab_size(config.vocab_size, tp),
                               config.hidden_act, config.dtype, tp) for _ in range(config.num_medusa_heads)])

            def forward(self, *args, **kwargs):
                out = super().forward(*args, **kwargs)
                if kwargs["use_cache"]:
                    if default_net().plugin_config.paged_kv_cache:
                        lm_logits, hidden_states, _ = out
                    else:
                        lm_logits, _, hidden_states = out
                if self.config.mapping.is_last_pp_rank():
                    medusa_logits = stack([h(hidden_states) for h in self.medusa_heads], dim=0)
                    medusa_logits.mark_output("medusa_logits", self.config.logits_dtype)
                    return medusa_logits, lm_logits
                return out

            def prepare_inputs(self, *args, **kwargs):
                kwargs["speculative_decoding_draft_tokens_external"] = False
                kwargs["max_draft_len"] = self.max_medusa_token_len
                return super().prepare_inputs(*args, **kwargs)

        self.__dict__["model"] = GenericMedusaForCausalLM(config)

    def __getattribute__(self, name):
        if name != "model" and "__" not in name:
            model = object.__getattribute__(self, "__dict__").get("model")
            if model is not None:
                return getattr(model, name)
        return object.__getattribute__(self, name)

    def __call__(self, *args, **kwargs):
        return self.__dict__["model"](*args, **kwargs)
