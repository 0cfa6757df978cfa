from .. import CALLS
from ..functional import Tensor
from ..module import Module


class ColumnLinear(Module):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1,
                 gather_output=True):
        super().__init__()
        self.in_features, self.out_features, self.bias = in_features, out_features, bias

    def forward(self, x):
        CALLS.append(("linear", id(self), self.out_features))
        return Tensor(f"linear({x.name})")
