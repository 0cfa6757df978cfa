"""The command line's flags, below cli.py (which alone imports this package):

* ``parsers.py``: every command's argparse parser (``build_parser``), made from declared.py;
* ``types.py``: argparse types with a range (``int_in``, ``non_negative``, ``fraction``);
* ``refused.py``: flags accepted only to be refused, with the reason;
* ``values.py``: what the commands read from their flags (paths, prompts, the MoE split, the device) and how a
  result is printed.

May import: ``declared``, ``archs`` (demo's families), ``quant``, ``files``, ``machine``, ``errors``; never cli or api.
"""
