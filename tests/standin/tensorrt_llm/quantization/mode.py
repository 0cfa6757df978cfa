"""tensorrt_llm/quantization/mode.py: the ``QuantAlgo`` names and the membership ``QuantMode.from_quant_algo`` asserts.

``QuantAlgo`` is a ``StrEnum``, so a config's plain string compares equal to its member only when spelled exactly
(``"fp8"`` is not ``FP8``). ``QUANT_ALGO_LIST`` is every member but ``INT8``; ``KV_CACHE_QUANT_ALGO_LIST`` is
``FP8``, ``INT8``, ``NVFP4``. ``from_quant_algo`` asserts both memberships before it maps the algorithm to flags
(the flags are not modelled: the stand-in's quantized layers read the algorithm itself).
"""

QUANT_ALGOS = ("W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
               "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
               "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
               "W4A8_QSERVE_PER_GROUP", "W4A8_QSERVE_PER_CHANNEL", "FP8", "FP8_PER_CHANNEL_PER_TOKEN",
               "FP8_BLOCK_SCALES", "INT8", "MIXED_PRECISION", "NVFP4", "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8",
               "W4A8_MXFP4_MXFP8", "W4A16_MXFP4", "NO_QUANT")
QUANT_ALGO_LIST = [a for a in QUANT_ALGOS if a != "INT8"]
KV_CACHE_QUANT_ALGO_LIST = ["FP8", "INT8", "NVFP4"]


def from_quant_algo(quant_algo=None, kv_cache_quant_algo=None):
    """``QuantMode.from_quant_algo``'s two assertions (a bare AssertionError, as upstream's)."""
    assert quant_algo is None or quant_algo in QUANT_ALGO_LIST
    assert kv_cache_quant_algo is None or kv_cache_quant_algo in KV_CACHE_QUANT_ALGO_LIST
