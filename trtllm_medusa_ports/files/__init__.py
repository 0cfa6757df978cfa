"""Files in and out: Hugging Face model directories, safetensors and pickles read lazily, JSON from
users' files, TensorRT-LLM checkpoints written atomically and read back, the NaN/Inf scan."""
