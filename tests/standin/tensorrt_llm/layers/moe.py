"""tensorrt_llm/layers/moe.py ``MoeConfig`` and ``MixtureOfExperts`` (``MOE``), unquantized.

``MoeConfig`` is a dataclass of nine fields (``from_dict`` is ``cls(**d)``: another key is a TypeError; ``to_dict``
is ``asdict``) with the ``ExpertScaleNormalizationMode`` IntEnum nested in it (NONE 0, RENORMALIZE 1, SPARSE_MIXER
2, DEVICE_LIMITED 3, DEVICE_LIMITED_RENORM 4); ``has_moe()`` is ``num_experts > 1``. ``MOE`` declares ``router`` = ``RowLinear(hidden, experts,
bias=False, dtype="float32", tp_size=1)`` (float32, never split), ``fc.weight`` ``[experts / ep,
2 * inter / tp, hidden]`` for a gated activation (first half linear, second half activated) and
``proj.weight`` ``[experts / ep, hidden, inter / tp]``; biases only with ``bias=True``. Expert
parallelism comes from ``mapping.moe_ep_size`` (1 here: pure tensor parallelism). Forward returns a
symbolic tensor (routing is the reference executor's to compute).
"""

import dataclasses
import enum
import inspect

from .. import CALLS
from ..functional import Tensor
from ..layers.linear import RowLinear
from ..module import Module
from ..parameter import Parameter


@dataclasses.dataclass
class MoeConfig:
    class ExpertScaleNormalizationMode(enum.IntEnum):
        NONE = 0
        RENORMALIZE = 1
        SPARSE_MIXER = 2
        DEVICE_LIMITED = 3
        DEVICE_LIMITED_RENORM = 4

    num_experts: int = 0
    shared_expert_intermediate_size: int = 0
    top_k: int = 0
    normalization_mode: int = ExpertScaleNormalizationMode.RENORMALIZE
    sparse_mixer_epsilon: float = 0.01
    tp_mode: int = 0
    device_limited_n_group: int = 0
    device_limited_topk_group: int = 0
    device_limited_routed_scaling_factor: float = 1.0

    @classmethod
    def from_dict(cls, d):
        return cls(**d)

    def to_dict(self):
        return dataclasses.asdict(self)

    def has_moe(self):
        return self.num_experts > 1

    def validate(self):
        if (self.num_experts == 0) != (self.top_k == 0):
            raise ValueError("Both or neither of num_experts and top_k must be set")
        return self


class MixtureOfExperts(Module):
    def __init__(self, moe_config, hidden_size, ffn_hidden_size, hidden_act, mapping=None, bias=True, dtype=None,
                 tp_group=None, tp_size=1, quant_mode=None, use_all_reduce=True):
        super().__init__()
        ep = getattr(mapping, "moe_ep_size", 1) if mapping is not None else 1
        tpm = getattr(mapping, "moe_tp_size", tp_size) if mapping is not None else tp_size
        if moe_config.num_experts % ep or ffn_hidden_size % tpm:
            raise ValueError("experts or the intermediate size do not divide by the expert / tensor parallel sizes")
        gated = hidden_act in ("swiglu", "gegelu")
        experts, inter = moe_config.num_experts // ep, ffn_hidden_size // tpm
        self.hidden_act, self.top_k = hidden_act, moe_config.top_k
        self.router = RowLinear(hidden_size, moe_config.num_experts, bias=False, dtype="float32", tp_size=1)
        self.fc = Module()
        self.fc.weight = Parameter(shape=(experts, (2 if gated else 1) * inter, hidden_size), dtype=dtype)
        self.proj = Module()
        self.proj.weight = Parameter(shape=(experts, hidden_size, inter), dtype=dtype)
        for part, out in ((self.fc, (2 if gated else 1) * inter), (self.proj, hidden_size)):
            if bias:
                part.bias = Parameter(shape=(experts, out), dtype=dtype)
            else:
                part.register_parameter("bias", None)
        self._dims = dict(experts=experts, hidden=hidden_size, fc_out=(2 if gated else 1) * inter, inter=inter,
                          dtype=dtype)

    def quantize_weight_only(self, bits):
        """``MOEWeightWrapper`` with a weight-only quant mode (what ``quantize_layers`` rebuilds the layer with):
        ``weight`` int8 ``[experts, in, out * bits / 8]`` (transposed, int4 two values a byte) and
        ``per_channel_scale`` ``[experts, out]`` in the model dtype, for fc and proj."""
        d = self._dims
        self._weight_only = True
        for part, in_f, out_f in ((self.fc, d["hidden"], d["fc_out"]), (self.proj, d["inter"], d["hidden"])):
            part.weight = Parameter(shape=(d["experts"], in_f, out_f * bits // 8), dtype="int8")
            part.per_channel_scale = Parameter(shape=(d["experts"], out_f), dtype=d["dtype"])

    def forward(self, hidden_states, lora_layer_params=None, **kwargs):
        CALLS.append(("moe", id(self), self.top_k))
        return Tensor(f"moe({getattr(hidden_states, 'name', hidden_states)})")


    def to(self, moe_cls):
        """``MixtureOfExperts.to``: ``moe_cls(**get_init_params(self))`` - every argument of this layer's own
        ``__init__`` (tensorrt_llm/_utils.py ``get_init_params`` without a filter class) - then its weights. An
        argument ``moe_cls`` does not take is the TypeError upstream raises; the weights are carried over whole."""
        if isinstance(self, moe_cls):
            return self
        if moe_cls is MoeOOTB and getattr(self, "_weight_only", False):  # MoeOOTB.init_experts, after quantize
            raise ValueError("OOTB MOE does not support weight only quantization now")
        accepted = inspect.signature(moe_cls.__init__).parameters
        for name in list(inspect.signature(type(self).__init__).parameters)[1:]:
            if name not in accepted:
                raise TypeError(f"{moe_cls.__name__}.__init__() got an unexpected keyword argument '{name}'")
        new = object.__new__(moe_cls)
        new.__dict__.update(self.__dict__)
        return new


MOE = MixtureOfExperts


class MoeOOTB(MixtureOfExperts):
    """The plugin-free MoE ``to_ootb_moe`` swaps in when ``--moe_plugin disable`` (same ``__init__`` as ``MOE``)."""


class SharedMoE(MixtureOfExperts):
    """``MOE`` plus ``shared_expert`` = ``MLP(hidden, shared_inter, hidden_act, bias=False, tp_size)`` (its fc
    ``[2 * shared / tp, hidden]`` for swiglu, linear half first) and ``shared_expert_gate`` =
    ``RowLinear(hidden, 1, bias=False, tp_size=1)`` in the model dtype; one all-reduce of the sum."""

    def __init__(self, moe_config, hidden_size, ffn_hidden_size, hidden_act, mapping=None, bias=True, dtype=None,
                 tp_group=None, tp_size=1, quant_mode=None, use_shared_gate=False, use_side_stream=False):
        super().__init__(moe_config, hidden_size, ffn_hidden_size, hidden_act, mapping=mapping, bias=bias,
                         dtype=dtype, tp_group=tp_group, tp_size=tp_size, use_all_reduce=False)
        from ..layers.mlp import MLP

        self.shared_expert = MLP(hidden_size, moe_config.shared_expert_intermediate_size, hidden_act, bias=False,
                                 dtype=dtype, tp_size=tp_size, is_expert=True)
        if use_shared_gate:
            self.shared_expert_gate = RowLinear(hidden_size, 1, bias=False, dtype=dtype, tp_size=1)
