"""tensorrt_llm/layers/linear.py ``Linear`` (= ``ColumnLinear``) and ``RowLinear``.

Column: weight ``[out // tp, in]``, bias ``[out // tp]``. Row: weight ``[out, in // tp]``,
bias ``[out]`` (added once, after the all-reduce). ``bias=False`` registers ``None``.
Forward computes with torch when input and weight carry values; a RowLinear returns
this rank's partial sum (the stand-in has no collectives: a test adds the ranks up,
as upstream's all-reduce does).
"""

import torch

from .. import CALLS
from ..functional import Tensor
from ..module import Module
from ..parameter import Parameter


class _LinearBase(Module):
    def __init__(self, local_in, local_out, bias, dtype):
        super().__init__()
        self.weight = Parameter(shape=(local_out, local_in), dtype=dtype)
        if bias:
            self.bias = Parameter(shape=(local_out,), dtype=dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x, *args, **kwargs):
        CALLS.append(("linear", id(self), self.weight.shape[0]))
        w, b = self.weight.value, self._parameters.get("bias")
        if x.value is None or w is None:
            return Tensor(f"linear({x.name})")
        y = x.value @ torch.as_tensor(w).T
        if b is not None and b.value is not None and self._adds_bias():
            y = y + torch.as_tensor(b.value)
        return Tensor(f"linear({x.name})", y)

    def _adds_bias(self):
        return True


class Linear(_LinearBase):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1,
                 gather_output=True, share_weight=None, strict_dtype=False, pad_lda=0, pad_ldc=0,
                 prefer_managed_weight=True, is_qkv=False):
        super().__init__(in_features, out_features // tp_size, bias, dtype)
        self.in_features, self.out_features = in_features, out_features // tp_size
        self.tp_size, self.gather_output = tp_size, gather_output


ColumnLinear = Linear


class RowLinear(_LinearBase):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1,
                 strict_dtype=False, pad_lda=0, prefer_managed_weight=True, is_expert=False):
        super().__init__(in_features // tp_size, out_features, bias, dtype)
        self.in_features, self.out_features, self.tp_size = in_features // tp_size, out_features, tp_size
