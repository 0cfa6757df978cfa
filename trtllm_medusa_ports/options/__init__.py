"""What the API's functions check and compute from their options before the stage below runs, below api.py
(which alone imports this package):

* ``validation.py``: the spec of every options field and the validator (docs/api.md "Input validation");
* ``prompts.py``: the prompts an options dataclass names, as token ids;
* ``calibration.py``: convert's calibration flags that do not apply, verify's samples for a tool's checkpoint;
* ``check.py``: check's memory plan and learned-position range.

May import: the stages below it (``conversion``, ``compat``, ``gpu``, ``quant``, ``heads``, ``trees``), ``declared``,
``archs``, ``files``, ``machine``, ``errors``; never api or cli.
"""
