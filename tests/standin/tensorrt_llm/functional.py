from types import SimpleNamespace

from . import CALLS


class Tensor:
    """A symbolic value: a name, nothing else."""

    def __init__(self, name):
        self.name = name

    def __add__(self, other):
        return Tensor(f"({self.name} + {getattr(other, 'name', other)})")

    def mark_output(self, name, dtype):
        CALLS.append(("mark_output", name))


def _act(name):
    def f(x):
        CALLS.append(("act", name))
        return Tensor(f"{name}({x.name})")
    return f


ACT2FN = {n: _act(n) for n in ("silu", "gelu", "gelu_new", "swiglu", "relu", "gelu_pytorch_tanh")}


def stack(tensors, dim=0):
    CALLS.append(("stack", len(tensors)))
    return Tensor(f"stack[{len(tensors)}]")


_NET = SimpleNamespace(plugin_config=SimpleNamespace(paged_kv_cache=True))


def default_net():
    return _NET
