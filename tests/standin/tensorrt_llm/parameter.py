"""tensorrt_llm/parameter.py ``Parameter``.

A parameter made with a ``shape`` and no value is *not inited*: ``PretrainedModel.load``
requires it. One made with a value (rotary tables) is inited and never required.
Assigning ``.value`` asserts the shape (``Parameter.value`` setter).
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
        if shape != self._shape and not (all(s == 1 for s in self._shape) and v.numel() == 1):
            raise AssertionError(f"The value updated is not the same shape as the original. "
                                 f"Updated: {shape}, original: {self._shape}")
        self._value = v
