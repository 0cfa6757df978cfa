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


#: convert's flags (and their defaults) a base quantized by NVIDIA's tools cannot honour: it keeps its own
#: quantization, mapping and layout, and add-heads reads its family from its config.json and calibrates nothing
ADD_HEADS_REFUSED = (
    ("--qformat", "qformat", None, "quantization"), ("--use_weight_only", "use_weight_only", False, "quantization"),
    ("--weight_only_precision", "weight_only_precision", None, "quantization"),
    ("--kv_cache_dtype", "kv_cache_dtype", None, "quantization"), ("--int8_kv_cache", "int8_kv_cache", False,
                                                                   "quantization"),
    ("--calib_dataset", "calib_dataset", None, "calibration"), ("--calib_size", "calib_size", 512, "calibration"),
    ("--calib_max_seq_length", "calib_max_seq_length", 512, "calibration"),
    ("--tokenizer_dir", "tokenizer_dir", None, "calibration"), ("--device", "device", "cpu", "calibration"),
    ("--threads", "threads", None, "calibration"),
    ("--tp_size", "tp_size", 1, "mapping"), ("--pp_size", "pp_size", 1, "mapping"),
    ("--moe_ep_size", "moe_ep_size", -1, "mapping"), ("--moe_tp_size", "moe_tp_size", -1, "mapping"),
    ("--use_parallel_embedding", "use_parallel_embedding", False, "layout"),
    ("--embedding_sharding_dim", "embedding_sharding_dim", 0, "layout"),
    ("--share_lm_head", "share_lm_head", False, "layout"),
    ("--model_type", "model_type", None, "family"),
    ("--allow_unsupported", "allow_unsupported", False, "override"),
)
ADD_HEADS_WHY = {
    "quantization": "the base keeps its own quantization (its tensors are copied as they are)",
    "calibration": "nothing is calibrated: the base keeps the scales its tool wrote",
    "mapping": "the base keeps its own mapping (tensor/pipeline/expert parallelism: its rank files as they are)",
    "layout": "the base keeps its own embedding and lm_head layout",
    "family": "the family is read from the base checkpoint's config.json (architecture)",
    "override": "add-heads runs no check that --allow_unsupported overrides",
}
