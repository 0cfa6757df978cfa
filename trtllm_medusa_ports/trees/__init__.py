"""Medusa trees: what a tree is, what it accepts, and how one is tuned for a base's heads.

* ``tree``: ``medusa_choices`` parsed and validated (presets, @FILE, JSON), TensorRT-LLM's buffers (``MedusaTree``);
* ``acceptance``: the tokens per step a tree accepts from the heads' ranks (until the end token, and on average);
* ``tune``: ``tune-tree`` - the heads measured on held-out text, the tree built from their accuracy.

The package imports none of its modules: ``tree`` sits below the families and the converter, ``tune`` above the
Hugging Face base (docs/layers.md places each).

May import: ``files``, ``errors``; ``trees.tune`` also ``heads``, ``huggingface`` and ``machine``.
"""
