"""What "N ranks train the heads one process trains" means, in one place: the train-heads flags both runs use and
the comparisons of their outputs. Used by ``scripts/validate_torchrun.py`` (real torchrun) and by
``tests/test_train_distributed.py`` (ranks forked with torchrun's environment), which load this file by its path.

Each ``*_differences`` function returns what differs, in words (an empty list: nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ARCH = "LlamaForCausalLM"
#: float32 throughout: the comparison is of the data-parallel sums, not of bfloat16 rounding
FLAGS = ["--num_heads", "2", "--steps", "8", "--batch_size", "24", "--new_tokens", "8", "--dtype", "float32",
         "--fit_dtype", "float32", "--threads", "1", "--quiet"]
#: the same run as api options: FitOptions' and TrainOptions' fields for FLAGS
FIT = {"num_heads": 2, "steps": 8, "batch_size": 24, "matmul_dtype": "float32", "quiet": True}
TRAIN = {"new_tokens": 8, "dtype": "float32", "threads": 1}
#: the heads' tolerance (float32 sums in another order), the history's (loss, top-1) and the corpus hidden states'
HEADS_ATOL, LOSS_ATOL, TOP1_ATOL, HIDDEN_ATOL = 2e-5, 2e-4, 2e-3, 1e-5
#: what a finished run leaves in its work directory: the ranks' corpus shares merged into one file
WORK_FILES = [".lock", "corpus.pt", "state.pt"]


def write_prompts(path: Path, vocab: int) -> Path:
    """12 prompts of one length (no padding: the ranks' batches compute what one batch does), as JSON lines."""
    g = torch.Generator().manual_seed(0)
    path.write_text("".join(json.dumps({"prompt_ids": torch.randint(1, vocab, (5,), generator=g).tolist()}) + "\n"
                            for _ in range(12)))
    return path


def heads_file(out: Path) -> dict[str, torch.Tensor]:
    """The heads a run wrote (FasterDecoding's safetensors file in ``out``), by name."""
    from safetensors.torch import load_file

    return load_file(str(out / "medusa_lm_head.safetensors"))


def heads_max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Max |a - b| over the heads' tensors; infinite where their names or shapes differ."""
    if sorted(a) != sorted(b) or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def history_differences(a: list[dict], b: list[dict]) -> list[str]:
    """The same steps recorded (two at least), the losses and top-1s equal within LOSS_ATOL / TOP1_ATOL."""
    if [h["step"] for h in a] != [h["step"] for h in b] or len(a) < 2:
        return [f"steps {[h['step'] for h in a]} against {[h['step'] for h in b]}"]
    return [f"step {x['step']}: loss {x['loss']} / {y['loss']}, top-1 {x['top1']} / {y['top1']}"
            for x, y in zip(a, b, strict=True)
            if abs(x["loss"] - y["loss"]) > LOSS_ATOL
            or max(abs(p - q) for p, q in zip(x["top1"], y["top1"], strict=True)) > TOP1_ATOL]


def corpus_differences(work: Path, one_process_work: Path) -> list[str]:
    """The ranks' shares merged into the one ``corpus.pt`` a one-process run writes (same sequences, key and rows;
    hidden states within HIDDEN_ATOL), no share left behind."""
    names = sorted(p.name for p in work.iterdir())
    if names != WORK_FILES:
        return [f"{work} holds {names}, expected {WORK_FILES}"]
    mine = torch.load(work / "corpus.pt", weights_only=True)
    one = torch.load(one_process_work / "corpus.pt", weights_only=True)
    out = [f"{k} differs" for k in ("seqs", "key") if mine[k] != one[k]]
    if not torch.equal(mine["index"], one["index"]):
        out.append("index differs")
    if mine["hidden"].shape != one["hidden"].shape:
        out.append(f"hidden has shape {tuple(mine['hidden'].shape)}, expected {tuple(one['hidden'].shape)}")
    elif not torch.allclose(mine["hidden"], one["hidden"], atol=HIDDEN_ATOL):
        out.append(f"hidden differs by {float((mine['hidden'] - one['hidden']).abs().max()):.2e}")
    return out
