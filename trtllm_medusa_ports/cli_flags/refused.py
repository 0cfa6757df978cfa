"""Flags the command line accepts only to refuse them, each with what it would have needed.

May import: nothing (tables only).
"""

#: upstream examples/medusa/convert_checkpoint.py flags we accept but do not implement
NOT_SUPPORTED = {
    "--smoothquant": "SmoothQuant",
    "--per_channel": "SmoothQuant",
    "--per_token": "SmoothQuant",
    "--per_group": "group-wise quantization",
    "--meta_ckpt_dir": "Meta (params.json) checkpoints",
    "--group_size": "group-wise quantization",
    "--dataset-cache-dir": "calibration",
    "--storage-type": "a storage dtype other than --dtype",
    "--use_embedding_sharding": "sharing the embedding table with lm_head",
}
#: upstream flags that override config.json values; we always read config.json
FROM_CONFIG = ("--vocab_size", "--n_positions", "--n_layer", "--hidden_act", "--rotary_base", "--rotary_scaling")


#: convert's options (by field; their flags and defaults are declared.py's) a base quantized by NVIDIA's tools cannot
#: honour: it keeps its own quantization, mapping and layout, and add-heads reads its family from its config.json and
#: calibrates nothing
ADD_HEADS_REFUSED = {
    **dict.fromkeys(("qformat", "use_weight_only", "weight_only_precision", "kv_cache_dtype", "int8_kv_cache"),
                    "quantization"),
    **dict.fromkeys(("calib_dataset", "calib_size", "calib_max_seq_length", "tokenizer_dir", "device", "threads"),
                    "calibration"),
    **dict.fromkeys(("tp_size", "pp_size", "moe_ep_size", "moe_tp_size"), "mapping"),
    **dict.fromkeys(("use_parallel_embedding", "embedding_sharding_dim", "share_lm_head"), "layout"),
    "model_type": "family",
    "allow_unsupported": "override",
}
ADD_HEADS_WHY = {
    "quantization": "the base keeps its own quantization (its tensors are copied as they are)",
    "calibration": "nothing is calibrated: the base keeps the scales its tool wrote",
    "mapping": "the base keeps its own mapping (tensor/pipeline/expert parallelism: its rank files as they are)",
    "layout": "the base keeps its own embedding and lm_head layout",
    "family": "the family is read from the base checkpoint's config.json (architecture)",
    "override": "add-heads runs no check that --allow_unsupported overrides",
}
