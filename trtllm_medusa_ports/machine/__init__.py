"""The machines a command runs on: this one, and the GPU machine that serves the result.

* ``threads``: how many torch threads a computing command takes (the idle cores, measured);
* ``devices``: the torch device a command computes on, checked by computing there, and its fast dtype;
* ``progress``: tqdm bars on stderr, silenced by ``--quiet``;
* ``log``: the package's logger (every warning, note and status line) and ``--log_level``;
* ``gpu_machine``: what the GPU machine needs (TensorRT-LLM's version, its install and checkout commands), said once.

May import: ``errors`` alone (nothing else of the package: every layer above reads these). The package imports none
of its modules.
"""
