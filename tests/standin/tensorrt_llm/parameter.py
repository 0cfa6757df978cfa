"""tensorrt_llm/parameter.py ``Parameter``.

A parameter made with a ``shape`` and no value is *not inited*: ``PretrainedModel.load``
requires it. One made with a value (rotary tables) is inited and never required.
Assigning ``.value`` asserts the shape (``Parameter.value`` setter: ``v.shape == self.shape``), after a 0-D value is
reshaped to the declared shape where every declared dimension is 1: a per-tensor scale declared ``(1,)`` takes a
0-D value and ``[1]``, never ``[2]`` or ``[1, 1]``.
"""


class Parameter:
    def __init__(self, value=None, shape=None, dtype=None, is_buffer=False):
        self.dtype = dtype
        self.is_buffer = is_buffer
        if value is None:
            if not isinstance(shape, (list, tuple)):
                raise TypeError(f"Parameter needs a shape list or tuple, got {shape!r}")
            self._shape = tuple(int(s) for s in shape)
            self._value = None
        else:
            self._shape = tuple(value.shape)
            self._value = value

    @property
    def shape(self):
        return self._shape

    def is_inited(self):
        return self._value is not None

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        shape = tuple(v.shape)
        if shape != self._shape and not shape and self._shape and max(self._shape) == 1:
            v, shape = v.reshape(self._shape), self._shape  # a scalar fills a shape of ones
        if shape != self._shape:
            raise AssertionError(f"The value updated is not the same shape as the original. "
                                 f"Updated: {shape}, original: {self._shape}")
        # quantized parameters: a value of another type does not become an int8 / fp8 weight of a
        # strongly typed network (builder.py builds FP8 networks strongly typed; the weight-only plugin reads
        # int8 bytes); float parameters keep upstream's casting to the network dtype
        want = _QUANTIZED_DTYPES.get(self.dtype)
        if want is not None and hasattr(v, "dtype") and str(v.dtype).removeprefix("torch.") != want:
            raise AssertionError(f"The value updated has dtype {v.dtype}, the parameter is {self.dtype}")
        self._value = v


_QUANTIZED_DTYPES = {"int8": "int8", "fp8": "float8_e4m3fn"}
