"""Files in and out: Hugging Face model directories, safetensors and pickles read lazily, JSON from
users' files, TensorRT-LLM checkpoints written atomically and read back, the NaN/Inf scan.

May import: ``errors``, ``machine``; ``files.byte_moves`` also ``quant`` (docs/layers.md places it with the work).
"""
