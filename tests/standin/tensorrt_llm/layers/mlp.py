"""tensorrt_llm/layers/mlp.py ``MLP`` and ``GatedMLP``.

MLP: ``fc`` ColumnLinear(hidden, 2 * ffn if hidden_act is "swiglu"/"gegelu" else ffn,
gather_output=False), ``proj`` RowLinear(ffn, hidden); forward ``proj(act(fc(x)))`` with
the activation applied to the *rank-local* fc output. GatedMLP adds ``gate``
ColumnLinear(hidden, ffn); forward ``proj(act(fc(x)) * gate(x))``: ``fc`` is the
activated branch.
"""

from ..functional import ACT2FN
from ..layers.linear import ColumnLinear, RowLinear
from ..module import Module


class MLP(Module):
    def __init__(self, hidden_size, ffn_hidden_size, hidden_act, bias=True, dtype=None, tp_group=None, tp_size=1,
                 quant_mode=None, inner_layernorm=False, eps=1e-05, is_expert=False):
        super().__init__()
        if hidden_act not in ACT2FN:
            raise ValueError(f"unsupported activation {hidden_act!r}")
        fc_out = 2 * ffn_hidden_size if hidden_act in ("swiglu", "gegelu") else ffn_hidden_size
        self.hidden_act = hidden_act
        self.fc = ColumnLinear(hidden_size, fc_out, bias=bias, dtype=dtype, tp_size=tp_size, gather_output=False)
        self.proj = RowLinear(ffn_hidden_size, hidden_size, bias=bias, dtype=dtype, tp_size=tp_size)

    def forward(self, hidden_states, lora_layer_params=None, **kwargs):
        return self.proj(ACT2FN[self.hidden_act](self.fc(hidden_states)))


class GatedMLP(MLP):
    def __init__(self, hidden_size, ffn_hidden_size, hidden_act, bias=True, dtype=None, tp_group=None, tp_size=1,
                 quant_mode=None, inner_layernorm=False, eps=1e-05, is_expert=False):
        super().__init__(hidden_size, ffn_hidden_size, hidden_act, bias, dtype, tp_group, tp_size)
        self.gate = ColumnLinear(hidden_size, ffn_hidden_size, bias=bias, dtype=dtype, tp_size=tp_size,
                                 gather_output=False)

    def forward(self, hidden_states, lora_layer_params=None, **kwargs):
        return self.proj(ACT2FN[self.hidden_act](self.fc(hidden_states)) * self.gate(hidden_states))
