"""The Hugging Face base: how the commands that run it (verify, train-heads, tune-tree, check's activation range,
convert's calibration) load it and read its states.

* ``model``: loading the base with transformers (float32, or rounded as the checkpoint stores it), its final hidden
  states (the lm_head's input), greedy continuations with the states they computed;
* ``streaming``: the base held one decoder layer (or other unit) at a time, read again from a temporary file;
* ``memory_mode``: which of the two a command runs in, from the one formula both commands estimate with.

May import: ``archs``, ``files``, ``errors``, ``log``, ``progress``, ``threads``, ``devices`` (the layers below
it, docs/layers.md); nothing of the stages above.
"""
