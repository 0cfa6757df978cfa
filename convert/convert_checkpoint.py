#!/usr/bin/env python3
"""Drop-in for TensorRT-LLM's examples/medusa/convert_checkpoint.py, for any supported base.

Same flag names (``--model_dir --medusa_model_dir --output_dir --dtype --tp_size
--pp_size --num_medusa_heads --num_medusa_layers --max_medusa_token_len
--model_type --workers --use_parallel_embedding --embedding_sharding_dim``) plus
``--share_lm_head --overwrite --quiet``. Head counts are read from the heads;
``--model_type`` from config.json. Then run ``trtllm-build --checkpoint_dir ...
--speculative_decoding_mode medusa`` (or ``trtllm-medusa build`` for ported bases).
It is ``trtllm-medusa convert`` under upstream's file name.
"""

import sys

from trtllm_medusa_ports.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]], prog="convert_checkpoint.py"))
