"""Medusa head checkpoints of every published layout, read into one canonical form."""

from trtllm_medusa_ports.heads.canonical import MedusaHeads
from trtllm_medusa_ports.heads.loader import LAYOUTS, load_heads

__all__ = ["LAYOUTS", "MedusaHeads", "load_heads"]
