from dataclasses import dataclass

from .. import CALLS
from ..module import Module


@dataclass
class SpecDecodingParams:
    """tensorrt_llm/layers/attention.py SpecDecodingParams (fields only)."""

    spec_decoding_is_generation_length_variable: bool = False
    spec_decoding_max_generation_length: int = 1
    spec_decoding_generation_lengths: object = None
    spec_decoding_position_offsets: object = None
    spec_decoding_packed_mask: object = None
    spec_decoding_use: object = None


class Attention(Module):
    """Upstream's keyword interface; records what it was given, computes nothing."""

    def __init__(self, *, local_layer_idx=0, hidden_size=0, num_attention_heads=0, **kwargs):
        super().__init__()
        self.local_layer_idx = local_layer_idx

    def forward(self, hidden_states, attention_mask=None, use_cache=False, spec_decoding_params=None,
                kv_cache_params=None, attention_params=None, lora_layer_params=None, **kwargs):
        CALLS.append(("attention", self.local_layer_idx, spec_decoding_params))
        return hidden_states
