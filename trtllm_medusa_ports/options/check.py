"""What check computes from its options beside the compatibility rules: the memory plan of the conversion it was
asked about, and the learned-position range of the base and tree.

May import: errors, and lazily convert, memory, archs, compat, files.hf_model and tree; never api or cli.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.errors import PortError


def memory_plan_for(opts):
    """The memory plan of what check was asked about (``opts``: an api.CheckOptions), and None; or None and the
    error that refused it, where the inputs cannot give one (check's findings say why, or carry that error)."""
    from trtllm_medusa_ports.conversion.convert import ConvertOptions, plan_layout
    from trtllm_medusa_ports.gpu.memory import memory_plan

    try:
        copts = ConvertOptions(model_dir=Path(opts.model_dir),
                               medusa_model_dir=Path(opts.medusa_model_dir) if opts.medusa_model_dir else None,
                               output_dir=Path("unused"), dtype=opts.dtype or "float16", tp_size=opts.tp_size,
                               pp_size=opts.pp_size, max_draft_len=opts.max_draft_len or 63,
                               share_lm_head=opts.share_lm_head, qformat=opts.qformat,
                               use_weight_only=opts.use_weight_only, weight_only_precision=opts.weight_only_precision,
                               kv_cache_dtype=opts.kv_cache_dtype, int8_kv_cache=opts.int8_kv_cache)
        return memory_plan(*plan_layout(copts)), None
    except PortError as exc:
        return None, exc
    except (ValueError, KeyError, ZeroDivisionError, RuntimeError):
        return None, None


def position_range_findings(opts) -> list:
    """``--max_seq_len`` and the tree's depth against the base's positions: a learned position table (an error) or a
    rotary base's context (a warning) (``opts``: an api.CheckOptions)."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.compat import learned_position_range, rope_context_range
    from trtllm_medusa_ports.files.hf_model import HFConfig
    from trtllm_medusa_ports.trees.tree import MedusaTree, resolve_choices

    try:
        hf = HFConfig.read(opts.model_dir)
        adapter = adapter_for(hf.architecture)
        heads = opts.num_medusa_heads or 4
        paths, _ = resolve_choices(opts.medusa_choices or "mc_sim_7b_63", heads)
        depth = MedusaTree.from_spec(paths, num_heads=heads).depth
        return (learned_position_range(hf, adapter, opts.max_seq_len, depth)
                + rope_context_range(hf, adapter, opts.max_seq_len, depth))
    except PortError:  # the base and tree rules already report an unreadable config or tree
        return []
