"""tensorrt_llm/_utils.py ``pad_vocab_size``: round the vocabulary up to a multiple of tp."""


def pad_vocab_size(vocab_size, tp_size):
    return -(-int(vocab_size) // int(tp_size)) * int(tp_size)


def get_init_params(obj, cls=None):
    """_utils.py ``get_init_params``: each argument of ``type(obj).__init__`` (``cls.__init__`` where given) that
    ``obj`` holds as an attribute of the same name, by that name: what ``parallelize_embedding`` and the quantizer
    rebuild a layer from."""
    import inspect

    names = list(inspect.signature((cls or type(obj)).__init__).parameters)[1:]
    return {name: getattr(obj, name) for name in names if hasattr(obj, name)}
