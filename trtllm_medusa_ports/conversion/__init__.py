"""The conversion stage: a Hugging Face base and its Medusa heads into a TensorRT-LLM checkpoint.

* ``convert``: the stage itself (``convert(opts)``: check, plan, quantize, write the rank files atomically);
* ``options``: its options and result (``ConvertOptions``, ``ConvertResult``, the default dtype);
* ``plan``: what to write - jobs, sources, splits, per-rank shapes, byte moves (nothing written);
* ``rank_writer``: the rank files streamed (byte moves in lanes, whole tensors beside them, swapped in whole).

May import: ``archs``, ``compat``, ``quant``, ``files``, ``sharding``, ``arrays``, ``findings``, ``deploy.commands``,
``memory``, ``tree``, ``errors``, ``log``, ``progress``, ``threads`` (docs/layers.md); never ``verify``.
"""
