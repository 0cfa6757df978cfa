"""tensorrt_llm/quantization: the quantized layers, ``quantize()`` and the load-time weight quantizer."""
