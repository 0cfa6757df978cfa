"""``convert``'s options and result (``ConvertOptions``, ``ConvertResult``): what the stage takes and what it
reports, apart from how it runs (convert.py) and how the rank files are written (rank_writer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports.compat import Finding
from trtllm_medusa_ports.deploy.commands import build_line
from trtllm_medusa_ports.machine import log


@dataclass
class ConvertOptions:
    model_dir: Path
    medusa_model_dir: Path
    output_dir: Path
    dtype: str = "auto"
    tp_size: int = 1
    pp_size: int = 1
    num_medusa_heads: int | None = None
    num_medusa_layers: int | None = None
    max_draft_len: int = 63
    model_type: str | None = None
    workers: int = 1
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0
    share_lm_head: bool = False
    overwrite: bool = False
    quiet: bool = False
    allow_unsupported: bool = False
    medusa_choices: str | None = None
    #: move bytes where no value changes (files/byte_moves.py); False: every tensor through torch
    #: (the reference the fast path is tested against)
    fast_path: bool = True
    #: the rank files reach the disk (fsync) before the output directory appears. Always done when
    #: an existing --output_dir is replaced (a power loss must not take the old checkpoint with
    #: the new one); for a new directory only on request, as ``cp``, ``save_pretrained`` and
    #: TensorRT-LLM's own convert scripts leave the data to the system's writeback
    fsync: bool = False
    #: quantization, upstream's spellings (trtllm_medusa_ports/quant): examples/quantization/quantize.py's
    #: --qformat / --kv_cache_dtype and examples/medusa/convert_checkpoint.py's --use_weight_only
    #: --weight_only_precision / --int8_kv_cache
    qformat: str | None = None
    use_weight_only: bool = False
    weight_only_precision: str | None = None
    kv_cache_dtype: str | None = None
    int8_kv_cache: bool = False
    calib_dataset: Path | None = None
    calib_size: int = 512
    calib_max_seq_length: int = 512
    tokenizer_dir: Path | None = None
    #: "auto": calibration prompts through the tokenizer's chat template where it has one; "none": as they are
    chat_template: str = "auto"
    revision: str | None = None  # model_dir's on the Hub, where it is a Hub id (files/hub.py)
    device: str = "cpu"
    #: torch threads of the calibration pass (None: the idle cores, threads.default_threads, as verify and
    #: train-heads: a busy machine's cores make every small operation wait for a descheduled thread)
    threads: int | None = None
    #: expert parallelism of MoE bases (upstream's convert_checkpoint.py --moe_ep_size): it divides tp_size, the
    #: experts split over it and their intermediate dim over tp_size / moe_ep_size
    moe_ep_size: int = 1
    #: a calibration already run on this base and dtype (quant/calibrate.py ``calibrate``): a pipeline that
    #: converts one base at several tp sizes calibrates once
    calibration: object = None


@dataclass
class ConvertResult:
    output_dir: Path
    config: dict
    findings: list[Finding]
    num_ranks: int
    num_tensors: int
    bytes_written: int
    seconds: float
    shared_lm_head_bytes_saved: int
    warnings: list[str] = field(default_factory=list)
    #: job label -> how its bytes reached the rank files (a MoveKind value)
    moves: dict[str, str] = field(default_factory=dict)
    #: GPU memory of the engine per rank (trtllm_medusa_ports/gpu/memory.py)
    memory: object = None

    def to_dict(self) -> dict:
        return {"output_dir": str(self.output_dir), "num_ranks": self.num_ranks, "num_tensors": self.num_tensors,
                "bytes_written": self.bytes_written, "seconds": round(self.seconds, 3),
                "shared_lm_head_bytes_saved": self.shared_lm_head_bytes_saved, "warnings": self.warnings,
                "findings": [f.to_dict() for f in self.findings], "config": self.config,
                "memory": self.memory.to_dict() if self.memory is not None else None, "moves": self.moves,
                "build_command": self.build_command}

    @property
    def build_command(self) -> str:
        """The build command this checkpoint needs (deploy/commands.py), engine directory left to fill."""
        return build_line(self.config, self.output_dir)

    def summary(self) -> str:
        s = (
            f"Wrote {self.output_dir}: {self.num_ranks} rank file(s) "
            f"(tp={self.config['mapping']['tp_size']}, pp={self.config['mapping']['pp_size']}), "
            f"{self.num_tensors} tensors, {self.bytes_written / 1e6:.1f} MB, "
            f"architecture {self.config['architecture']}, dtype {self.config['dtype']}, "
            f"{self.config['num_medusa_heads']} Medusa heads x {self.config['num_medusa_layers']} layer(s), "
            f"in {self.seconds:.1f} s."
        )
        q = self.config.get("quantization") or {}
        if q.get("quant_algo") or q.get("kv_cache_quant_algo"):
            s += f" Quantization: {q.get('quant_algo') or 'none'}, KV cache {q.get('kv_cache_quant_algo') or 'float'}"
            s += (" (weights stay float: TensorRT-LLM quantizes them at load)."
                  if q.get("quant_algo") in ("W8A16", "W4A16") else ".")
        if self.config.get("medusa_shared_lm_head"):
            s += (
                f" The heads share the base lm_head: {self.shared_lm_head_bytes_saved / 1e6:.1f} MB "
                "saved against one copy per head."
            )
        if self.memory is not None:
            s += "\n" + self.memory.render()
        return s + f"\nBuild it with: {self.build_command}"


def default_dtype(model_dir: Path) -> str:
    """convert's --dtype when none is given: float16, as upstream's Medusa script, except for a family whose hidden
    states leave float16's range (Gemma 2/3, published in bfloat16: rule float16-range, which build refuses), which
    keeps the base's own dtype and says so."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.files.hf_model import HFConfig

    say = log.get("convert").info
    try:
        hf = HFConfig.read(model_dir)
        adapter = adapter_for(hf.architecture)
    except (PortError, OSError, ValueError):
        return "float16"  # convert says what is wrong with the base
    if adapter is not None and adapter.float16_unsafe:
        say(f"note: --dtype not given: the base's own dtype (--dtype auto), not float16: {adapter.family} "
            "models' hidden states exceed float16's range (rule float16-range)")
        return "auto"
    if hf.dtype_name == "bfloat16":  # convert never runs the base: whether its activations fit float16 is verify's
        say("note: --dtype not given: float16, as upstream's script, from a bfloat16 base; `verify` measures "
            "whether its activations stay within float16's range (rule float16-range) and fails the checkpoint "
            "if not - then convert with --dtype bfloat16")
    return "float16"
