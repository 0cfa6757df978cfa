"""Layer / Model / ForCausalLM triples shaped like tensorrt_llm/models/<family>/model.py.

``plumbing=True`` (llama, qwen, gpt): forwards take ``spec_decoding_params`` and pass it
down to ``self.attention``. ``plumbing=False`` (gemma, phi, phi3, gptneox, falcon, bloom,
mpt): they do not, exactly as upstream, so passing it raises TypeError.
"""

from ..functional import Tensor
from ..layers import Attention, ColumnLinear
from ..models.modeling_utils import DecoderLayerList, DecoderModelForCausalLM
from ..module import Module


def family_classes(prefix, plumbing):
    if plumbing:
        class Layer(Module):
            def __init__(self, config, layer_idx):
                super().__init__()
                self.attention = Attention(local_layer_idx=layer_idx)

            def forward(self, hidden_states, attention_mask=None, use_cache=False, spec_decoding_params=None,
                        kv_cache_params=None, attention_params=None, lora_layer_params=None):
                return self.attention(hidden_states, use_cache=use_cache, spec_decoding_params=spec_decoding_params,
                                      kv_cache_params=kv_cache_params, attention_params=attention_params)

        class Model(Module):
            def __init__(self, config):
                super().__init__()
                self.layers = DecoderLayerList(Layer, config)

            def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None,
                        spec_decoding_params=None, kv_cache_params=None, attention_params=None, **kw):
                return self.layers(Tensor("embedding"), use_cache=use_cache, spec_decoding_params=spec_decoding_params,
                                   kv_cache_params=kv_cache_params, attention_params=attention_params)
    else:
        class Layer(Module):
            def __init__(self, config, layer_idx):
                super().__init__()
                self.attention = Attention(local_layer_idx=layer_idx)

            def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                        attention_params=None, lora_layer_params=None):
                return self.attention(hidden_states, use_cache=use_cache, kv_cache_params=kv_cache_params,
                                      attention_params=attention_params)

        class Model(Module):
            def __init__(self, config):
                super().__init__()
                self.layers = DecoderLayerList(Layer, config)

            def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None,
                        kv_cache_params=None, attention_params=None):
                return self.layers(Tensor("embedding"), use_cache=use_cache, kv_cache_params=kv_cache_params,
                                   attention_params=attention_params)

    class ForCausalLM(DecoderModelForCausalLM):
        def __init__(self, config):
            transformer = Model(config)
            lm_head = ColumnLinear(config.hidden_size, config.vocab_size, bias=False)
            super().__init__(config, transformer, lm_head)

    Layer.__name__, Model.__name__, ForCausalLM.__name__ = f"{prefix}DecoderLayer", f"{prefix}Model", f"{prefix}ForCausalLM"
    return Layer, Model, ForCausalLM
