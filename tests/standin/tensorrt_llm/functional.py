"""tensorrt_llm/functional.py, as far as the engine adapters and layers use it.

``Tensor`` is symbolic (a name) and optionally carries a torch value, so that linear
layers and activations can be checked numerically (a weight layout, a fused MLP).
``swiglu`` splits the *rank-local* input in two, first half ``x``, second half ``gate``,
and returns ``silu(gate) * x`` (functional.py ``swiglu``); ``gelu`` is the tanh form.

The shape operations the engine adapters build position ids with compute on values as TensorRT 10 would, dtypes
included: ``shape(x, dim)`` a 0-D **int64** tensor (TensorRT 10's IShapeLayer gives Int64; functional.py ``shape``
gathers one entry of it); ``concat`` turns ints into 1-element int32 constants, or int64 ones when an input is int64
(functional.py ``constants_to_tensors_``), and 0-D tensors into 1-element ones, and refuses tensors of two dtypes
(a tensor input is never cast there, and TensorRT's concatenation takes one type); ``slice(input, starts, sizes)``
takes TensorRT's starts and *sizes* (1-D), and where two of them are tensors they must have one type (TensorRT's
ISliceLayer refuses an int32 start beside an int64 size); ``unsqueeze`` / ``view`` reshape; ``+``, ``-`` and ``*``
broadcast a size-1 dimension, an int32 operand beside an int64 one cast to int64 (functional.py
``elementwise_binary``). A symbolic tensor (no value) stays symbolic.
"""

import builtins
from enum import IntEnum
from types import SimpleNamespace

import torch

from . import CALLS


class RotaryScalingType(IntEnum):
    """functional.py ``RotaryScalingType``: the members and ``from_string``, a plain name lookup in 1.2 (no alias, no
    case folding: ``su``, ``default`` or ``Linear`` raise ``ValueError("Unsupported rotary scaling type: ...")``; a
    missing type is looked up as None and raises the same)."""

    none = 0
    linear = 1
    dynamic = 2
    longrope = 3
    llama3 = 4
    yarn = 5
    mrope = 6

    @staticmethod
    def from_string(s):
        try:
            return RotaryScalingType[s]
        except KeyError:
            raise ValueError(f"Unsupported rotary scaling type: {s}") from None


def rotary_scaling_type(scaling):
    """How ``Attention.__init__`` and ``Attention.create_attention_const_params`` (layers/attention.py) read a
    ``rotary_scaling`` dict: its ``type``, else its ``rope_type``, through ``RotaryScalingType.from_string``, and its
    ``factor`` (1.0 without); (none, 1.0) for None. Not a dict: the ``.get`` raises AttributeError, as upstream's."""
    if scaling is None:
        return RotaryScalingType.none, 1.0
    kind = RotaryScalingType.from_string(scaling.get("type", scaling.get("rope_type")))
    return kind, scaling.get("factor", 1.0)


class Tensor:
    def __init__(self, name="tensor", value=None):
        self.name = name
        self.value = value

    def _bin(self, other, op, sym):
        ov = getattr(other, "value", other if not isinstance(other, Tensor) else None)
        if self.value is not None and ov is not None:
            return Tensor(f"({self.name}{sym}{getattr(other, 'name', other)})", op(self.value, ov))
        return Tensor(f"({self.name}{sym}{getattr(other, 'name', other)})")

    def __add__(self, other):
        return self._bin(other, torch.add, "+")

    __radd__ = __add__

    def __mul__(self, other):
        return self._bin(other, torch.mul, "*")

    __rmul__ = __mul__

    def __sub__(self, other):
        return self._bin(other, torch.sub, "-")

    def rank(self):
        return self.value.dim()

    def view(self, shape):
        return view(self, shape)

    def mark_output(self, name=None, dtype=None):
        default_net().outputs[name or self.name] = (self, dtype)
        CALLS.append(("mark_output", name or self.name))


def _unary(name, fn):
    def act(x):
        CALLS.append(("act", name))
        return Tensor(f"{name}({x.name})", None if x.value is None else fn(x.value))
    return act


def chunk(x, chunks, dim=-1):
    if x.value is None:
        return [Tensor(f"{x.name}[{i}/{chunks}]") for i in range(chunks)]
    return [Tensor(f"{x.name}[{i}/{chunks}]", v) for i, v in enumerate(torch.chunk(x.value, chunks, dim))]


def swiglu(x):
    CALLS.append(("act", "swiglu"))
    a, gate = chunk(x, 2, dim=-1)
    if x.value is None:
        return Tensor(f"swiglu({x.name})")
    return Tensor(f"swiglu({x.name})", torch.nn.functional.silu(gate.value) * a.value)


def _geglu(x):  # first half times gelu(second half) (functional.py geglu)
    a, b = chunk(x, 2, dim=-1)
    return Tensor(f"geglu({x.name})", None if x.value is None else
                  a.value * torch.nn.functional.gelu(b.value, approximate="tanh"))


def _symbolic_only(name):
    """An activation the stand-in names but does not compute: symbolic tensors pass, a value raises."""
    def act(x):
        if x.value is not None:
            raise NotImplementedError(f"the stand-in does not compute {name}")
        CALLS.append(("act", name))
        return Tensor(f"{name}({x.name})")
    return act


def _softplus(input, beta, threshold):  # functional.py softplus takes beta and threshold: ACT2FN's call lacks them
    raise TypeError("softplus() missing 2 required positional arguments: 'beta' and 'threshold'")


_tanh_gelu = lambda v: torch.nn.functional.gelu(v, approximate="tanh")  # noqa: E731  (functional.py gelu: tanh form)

#: functional.py ``ACT2FN``, every name (read whole from upstream's table; a name outside it is a KeyError, and
#: layers/mlp.py ``MLP`` refuses it first): gelu, gelu_new, gelu_fast, gelu_pytorch_tanh and openai-gelu are one
#: tanh-form gelu; relu2 and squared-relu one pow(relu(x), 2.0); swiglu and fast-swiglu one swiglu
ACT2FN = {
    "relu": _unary("relu", torch.relu),
    "tanh": _unary("tanh", torch.tanh),
    "gelu": _unary("gelu", _tanh_gelu),
    "gelu_new": _unary("gelu_new", _tanh_gelu),
    "gelu_fast": _unary("gelu_fast", _tanh_gelu),
    "gelu_pytorch_tanh": _unary("gelu_pytorch_tanh", _tanh_gelu),
    "openai-gelu": _unary("openai-gelu", _tanh_gelu),
    "geglu": _geglu,
    "gegelu": _symbolic_only("gegelu"),  # Phi-3-small's strided split: no family converts to it
    "identity": _unary("identity", lambda v: v),
    "silu": _unary("silu", torch.nn.functional.silu),
    "softplus": _softplus,
    "relu2": _unary("relu2", lambda v: torch.relu(v) ** 2),
    "squared-relu": _unary("squared-relu", lambda v: torch.relu(v) ** 2),
    "swiglu": swiglu,
    "fast-swiglu": swiglu,
    "sigmoid": _unary("sigmoid", torch.sigmoid),
    "quick_gelu": _unary("quick_gelu", lambda v: v * torch.sigmoid(1.702 * v)),
}


def stack(tensors, dim=0):
    CALLS.append(("stack", len(tensors)))
    vals = [t.value for t in tensors]
    return Tensor(f"stack[{len(tensors)}]", torch.stack(vals, dim) if all(v is not None for v in vals) else None)


class _Network:
    """tensorrt_llm/network.py Network: the plugin config of the build in progress and its outputs."""

    def __init__(self, plugin_config=None):
        self.plugin_config = plugin_config or SimpleNamespace(paged_kv_cache=True, remove_input_padding=True,
                                                             gpt_attention_plugin="auto")
        self.outputs = {}


_NET = [_Network()]


def default_net():
    return _NET[-1]


def set_default_net(net):
    _NET.append(net)


def reset_default_net():
    del _NET[1:]


def recv(tensor, src):
    """Pipeline stages: the hidden states of the previous stage."""
    CALLS.append(("recv", src))
    return Tensor(f"recv({src})")


def send(tensor, dest):
    CALLS.append(("send", dest))
    return tensor


def _ints(x):
    """A shape argument (a 1-D Tensor or a list of ints) as a list of ints, None when symbolic."""
    if isinstance(x, Tensor):
        return None if x.value is None else [int(v) for v in x.value.reshape(-1)]
    return [int(v) for v in x]


def shape(input, dim=None):
    if input.value is None:
        return Tensor(f"shape({input.name})")
    dims = torch.tensor(list(input.value.shape), dtype=torch.int64)  # TensorRT 10: shape tensors are Int64
    return Tensor(f"shape({input.name})", dims if dim is None else dims[dim])


def concat(inputs, dim=0):
    tensors = [i for i in inputs if not isinstance(i, int)]
    if any(i.value is None for i in tensors):
        return Tensor("concat(...)")
    # constants_to_tensors_: ints become int32 constants, int64 ones when any input is int64 (or out of int32's
    # range); tensor inputs are kept as they are
    wide = any(i.value.dtype == torch.int64 for i in tensors) or any(
        isinstance(i, int) and not -2 ** 31 <= i < 2 ** 31 for i in inputs)
    parts = [torch.tensor([i], dtype=torch.int64 if wide else torch.int32) if isinstance(i, int) else
             (i.value.reshape(1) if i.value.dim() == 0 else i.value) for i in inputs]
    if len({p.dtype for p in parts}) > 1:
        raise TypeError(f"concat: inputs of different types {sorted(str(p.dtype) for p in parts)} (TensorRT's "
                        "concatenation takes one type; tensorrt_llm/functional.py concat casts none)")
    return Tensor("concat(...)", torch.cat(parts, dim=dim))


def _same_shape_types(**args):
    """TensorRT's ISliceLayer: its start, size and stride tensors are of one type (Int32 or Int64)."""
    types = {k: v.value.dtype for k, v in args.items() if isinstance(v, Tensor) and v.value is not None}
    if len(set(types.values())) > 1:
        raise TypeError("slice: " + ", ".join(f"{k} {str(t).removeprefix('torch.')}" for k, t in types.items())
                        + ": TensorRT's slice layer takes its start, size and stride tensors of one type")


def slice(input, starts, sizes, strides=None, mode=None, fill_value=None):
    _same_shape_types(starts=starts, sizes=sizes, strides=strides)
    begin, size = _ints(starts), _ints(sizes)
    if input.value is None or begin is None or size is None:
        return Tensor(f"slice({input.name})")
    index = tuple(builtins.slice(b, b + n) for b, n in zip(begin, size, strict=True))
    return Tensor(f"slice({input.name})", input.value[index])


def unsqueeze(input, axis):
    return Tensor(f"unsqueeze({input.name})", None if input.value is None else input.value.unsqueeze(axis))


def view(input, shape, zero_is_placeholder=True):
    dims = _ints(shape)
    if input.value is None or dims is None:
        return Tensor(f"view({input.name})")
    return Tensor(f"view({input.name})", input.value.reshape(dims))

