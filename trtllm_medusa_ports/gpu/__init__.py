"""What the GPU serving the engine runs and holds, worked out here without one.

* ``xqa``: which XQA kernels serve a Medusa generation step on each GPU (TensorRT-LLM 1.2's route and each kernel
  family's limits: data and pure functions);
* ``memory``: the memory an engine of a checkpoint holds per rank before any build (its weights from the conversion's
  plan, the KV cache per token), which check and deploy judge against ``--gpu_memory_gb``.

May import: the file layer, ``quant`` (its vocabulary), ``weights`` (the split rules), ``errors``. The package imports
none of its modules: ``xqa`` sits with the work, below the compatibility rules that read it.
"""
