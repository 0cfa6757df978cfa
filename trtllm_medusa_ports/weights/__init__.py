"""How weights split and reshape, written once for every family.

* ``sharding``: the tensor- and pipeline-parallel split rules (columns, rows, fused QKV, KV heads per rank, vocabulary
  padding) and the ``Mapping`` of ranks;
* ``arrays``: the few array operations the layouts need, on torch tensors and numpy arrays alike.

May import: ``errors`` and its own modules (``sharding`` reads ``arrays``). The families' adapters (``archs``), the
conversion plan and the executor read it.
"""
