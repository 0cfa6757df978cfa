"""Medusa head checkpoints of every published layout, read into one canonical form.

May import: ``archs``, ``files``, ``machine``, ``errors``; ``heads.corpus`` and ``heads.train`` also the
Hugging Face base (``huggingface``): docs/layers.md places them above the rest of the package.
"""

from trtllm_medusa_ports.heads.canonical import MedusaHeads
from trtllm_medusa_ports.heads.loader import LAYOUTS, load_heads

__all__ = ["LAYOUTS", "MedusaHeads", "load_heads"]
