"""Serving a checkpoint: the commands it builds and runs with (``commands``), read from its config.json alone.

May import: its own modules and ``xqa``; nothing here imports ``tensorrt_llm``.
"""
