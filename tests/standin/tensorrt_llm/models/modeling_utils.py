from .. import CALLS
from ..functional import Tensor
from ..module import Module, ModuleList


class PretrainedConfig:
    """Keyword-only config; every field becomes an attribute (modeling_utils.PretrainedConfig)."""

    def __init__(self, *, architecture, **kwargs):
        self.architecture = architecture
        for k, v in kwargs.items():
            setattr(self, k, v)


class DecoderLayerList(ModuleList):
    """Calls each layer; adds spec_decoding_params to its kwargs only when it is not None."""

    def __init__(self, cls, config):
        super().__init__([cls(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, hidden_states, use_cache=False, spec_decoding_params=None, **kwargs):
        if spec_decoding_params is not None:
            kwargs["spec_decoding_params"] = spec_decoding_params
        for layer in self:
            hidden_states = layer(hidden_states, use_cache=use_cache, **kwargs)
        return hidden_states


class DecoderModelForCausalLM(Module):
    """forward: transformer -> lm_head; spec_decoding_params is passed only when not None."""

    config_class = PretrainedConfig

    def __init__(self, config, transformer, lm_head):
        super().__init__()
        self.config, self.transformer, self.lm_head = config, transformer, lm_head

    def forward(self, input_ids, position_ids=None, use_cache=False, spec_decoding_params=None, **kwargs):
        if spec_decoding_params is not None:
            kwargs["spec_decoding_params"] = spec_decoding_params
        hidden = self.transformer.forward(input_ids, position_ids=position_ids, use_cache=use_cache, **kwargs)
        logits = self.lm_head(hidden)
        return (logits, Tensor("hidden_states"), None) if use_cache else logits

    def prepare_inputs(self, *args, **kwargs):
        CALLS.append(("prepare_inputs", kwargs))
        return kwargs
