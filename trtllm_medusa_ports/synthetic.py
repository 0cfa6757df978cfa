"""Small synthetic bases and Medusa heads, for the demo, the tests and the benchmarks.

No model hub is reachable, so bases are built from configs with random weights
(``AutoModelForCausalLM.from_config``) and saved like any HF checkpoint. Heads
can be random, or *trained* on the base's own greedy continuations so that they
really predict (multi-token acceptance), in a few seconds on a CPU. Heads are
written in every published layout (docs/heads.md) by :func:`save_heads`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


def _tiny_configs() -> dict[str, dict]:
    """The tiny config each family's adapter declares (``tiny_config``), by HF architecture."""
    from trtllm_medusa_ports.archs import registry

    return {cls.hf_architectures[0]: cls.tiny_config for cls in dict.fromkeys(registry().values())
            if cls.__dict__.get("tiny_config")}


#: tiny configs per HF architecture: small enough for CPU tests, shaped like the real thing
TINY_CONFIGS: dict[str, dict] = _tiny_configs()


def tiny_config(architecture: str, **overrides):
    from transformers import AutoConfig

    if architecture not in TINY_CONFIGS:
        raise KeyError(f"no tiny config for {architecture}; known: {', '.join(TINY_CONFIGS)}")
    kw = dict(TINY_CONFIGS[architecture])
    kw.update(overrides)
    model_type = kw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg.architectures = [architecture]
    return cfg


def save_tiny_base(architecture: str, out_dir: str | Path, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                   init_std: float | None = None, embedding_gain: float = 1.0, norm_scale: float = 0.0,
                   **overrides) -> Path:
    """Build a random base of this architecture and ``save_pretrained`` it (safetensors).

    ``embedding_gain`` > 1 lets the token embedding dominate the residual stream, so
    the next token depends mostly on the current one: greedy text then runs into short
    cycles that small heads can learn (the demo and acceptance tests use this; real
    models are predictable for better reasons).

    ``norm_scale`` > 0 adds up to that much to every norm weight: real checkpoints carry norm
    weights in the hundreds to thousands (Gemma 3 up to ~1.6e3) and hidden states of 1e4 to 1e5,
    which is where rounding order and float16's range start to matter.
    """
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(architecture, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and init_std is not None:
                p.normal_(0.0, init_std)
            elif p.dim() == 1:
                # from_config leaves biases at 0 and norm weights at 1: perturb them so that a
                # dropped bias or a misplaced norm changes the output (and a test can see it)
                p.add_(torch.randn_like(p) * 0.1)
        if norm_scale:
            gen = torch.Generator().manual_seed(seed + 1)
            for name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                    p.add_(torch.rand(p.shape, generator=gen) * norm_scale)
        if embedding_gain != 1.0:
            model.get_input_embeddings().weight.mul_(embedding_gain)
    model = model.to(dtype)
    out = Path(out_dir)
    model.save_pretrained(out)
    return out


def save_tiny_tokenizer(out_dir: str | Path, vocab_size: int) -> Path:
    """A word-level tokenizer with one token per id (``t0`` ... ``t{vocab-1}``), saved beside a base.

    TensorRT-LLM's ``examples/run.py`` always loads a tokenizer from ``--tokenizer_dir``
    (examples/utils.py ``load_tokenizer``), even when the input is given as token ids; tiny
    random bases have none and no hub is reachable, so this builds one offline. ``t0`` is the
    end, padding and unknown token. Save it in a folder of its own: beside a config.json,
    transformers 5 loads the family's tokenizer class instead (Qwen2Tokenizer, ...).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", eos_token="t0", pad_token="t0")
    out = Path(out_dir)
    tok.save_pretrained(out)
    return out


# -- heads -------------------------------------------------------------------------------
@dataclass
class HeadWeights:
    """Heads in memory: ``blocks[h][l] = (weight [H,H], bias [H])``, own ``lm_heads[h]`` or None."""

    blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]
    lm_heads: list[torch.Tensor] | None

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    @property
    def num_layers(self) -> int:
        return len(self.blocks[0])

    def apply(self, hidden: torch.Tensor, base_lm_head: torch.Tensor) -> torch.Tensor:
        """Logits ``[heads, ..., vocab]`` of every head for final-norm hidden states."""
        outs = []
        for h, blocks in enumerate(self.blocks):
            x = hidden
            for w, b in blocks:
                x = x + torch.nn.functional.silu(x @ w.T + b)
            proj = self.lm_heads[h] if self.lm_heads is not None else base_lm_head
            outs.append(x @ proj.T)
        return torch.stack(outs)


def random_heads(hidden: int, vocab: int, num_heads: int = 3, num_layers: int = 1, *, seed: int = 0,
                 own_lm_head: bool = True, scale: float = 0.05) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    blocks = [
        [(torch.randn(hidden, hidden, generator=g) * scale, torch.randn(hidden, generator=g) * scale)
         for _ in range(num_layers)]
        for _ in range(num_heads)
    ]
    lm = [torch.randn(vocab, hidden, generator=g) * scale for _ in range(num_heads)] if own_lm_head else None
    return HeadWeights(blocks, lm)


def _final_hidden_and_lm_head(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(input_ids=ids, output_hidden_states=True)
    return out.hidden_states[-1], model.get_output_embeddings().weight


@torch.no_grad()
def greedy_corpus(model_dir: str | Path, *, num_prompts: int = 64, prompt_len: int = 4, new_tokens: int = 24,
                  seed: int = 0, prompts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The base's greedy continuations of prompts (random ids unless given, ``[n, len]``):
    (tokens, final hidden states, lm_head)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    if prompts is None:
        prompts = torch.randint(0, vocab, (num_prompts, prompt_len), generator=g)
    seqs = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                          do_sample=False, min_new_tokens=new_tokens, pad_token_id=0)
    hidden, lm_head = _final_hidden_and_lm_head(model, seqs)
    return seqs, hidden, lm_head.detach().clone()


def train_heads(model_dir: str | Path, *, num_heads: int = 3, num_layers: int = 1, steps: int = 300,
                own_lm_head: bool = True, seed: int = 0, lr: float = 3e-2, prompts: torch.Tensor | None = None,
                new_tokens: int = 24, quiet: bool = True, positions_per_step: int | None = None) -> HeadWeights:
    """Fit heads to the base's greedy continuations (head k predicts the token k+2 ahead).

    FasterDecoding's recipe in miniature: ResBlocks start at zero, each head's
    lm_head starts as the base's, cross-entropy on self-distilled data.
    """
    seqs, hidden, base_lm = greedy_corpus(model_dir, seed=seed, prompts=prompts, new_tokens=new_tokens)
    torch.manual_seed(seed)
    H = hidden.shape[-1]
    params = []
    blocks = []
    lms = []
    for _ in range(num_heads):
        row = []
        for _ in range(num_layers):
            w = torch.zeros(H, H, requires_grad=True)
            b = torch.zeros(H, requires_grad=True)
            row.append((w, b))
            params += [w, b]
        blocks.append(row)
        if own_lm_head:
            lm = base_lm.clone().requires_grad_(True)
            lms.append(lm)
            params.append(lm)
    opt = torch.optim.Adam(params, lr=lr)
    import sys

    from tqdm import tqdm

    # As the heads grow confident, most softmax probabilities fall into float32's subnormal
    # range, which x86 CPUs compute many times slower: flush them to zero while training.
    flushed = torch.set_flush_denormal(True)
    for _ in tqdm(range(steps), desc="train heads", unit="step", disable=quiet, file=sys.stderr):
        opt.zero_grad()
        loss = 0.0
        for k in range(num_heads):
            shift = k + 2
            x = hidden[:, :-shift].reshape(-1, H)
            y = seqs[:, shift:].reshape(-1)
            if positions_per_step and positions_per_step < y.shape[0]:  # minibatch (large vocabularies)
                pick = torch.randint(0, y.shape[0], (positions_per_step,))
                x, y = x[pick], y[pick]
            for w, b in blocks[k]:
                x = x + torch.nn.functional.silu(x @ w.T + b)
            proj = lms[k] if own_lm_head else base_lm
            loss = loss + torch.nn.functional.cross_entropy(x @ proj.T, y)
        loss.backward()
        opt.step()
    if flushed:
        torch.set_flush_denormal(False)
    return HeadWeights(
        [[(w.detach().clone(), b.detach().clone()) for w, b in row] for row in blocks],
        [lm.detach().clone() for lm in lms] if own_lm_head else None,
    )


#: layouts :func:`save_heads` writes (the loader reads each)
HEAD_LAYOUTS = ("fasterdecoding-pt", "fasterdecoding-safetensors", "fasterdecoding-v2", "axolotl", "modelopt", "vllm")


def save_heads(heads: HeadWeights, out_dir: str | Path, layout: str = "fasterdecoding-pt", *,
               dtype: torch.dtype = torch.float32, base_dir: str | Path | None = None,
               config_extra: dict | None = None) -> Path:
    """Write heads the way each published tool saves them."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    H = heads.blocks[0][0][0].shape[0] if heads.num_layers else heads.lm_heads[0].shape[1]
    L = heads.num_layers

    def fd_keys(prefix: str = "") -> dict[str, torch.Tensor]:
        sd = {}
        for h, row in enumerate(heads.blocks):
            for layer, (w, b) in enumerate(row):
                sd[f"{prefix}{h}.{layer}.linear.weight"] = w.to(dtype).contiguous()
                sd[f"{prefix}{h}.{layer}.linear.bias"] = b.to(dtype).contiguous()
            if heads.lm_heads is not None and layout != "fasterdecoding-v2":
                sd[f"{prefix}{h}.{L}.weight"] = heads.lm_heads[h].to(dtype).contiguous()
        return sd

    cfg: dict = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": L, "base_model_name_or_path": "local/base"}
    if layout == "fasterdecoding-pt":
        torch.save(fd_keys(), out / "medusa_lm_head.pt")
    elif layout == "fasterdecoding-safetensors":
        save_file(fd_keys(), str(out / "medusa_lm_head.safetensors"))
    elif layout == "fasterdecoding-v2":
        save_file(fd_keys(), str(out / "medusa_lm_head.safetensors"))
        cfg["version"] = "2"
    elif layout == "modelopt":
        save_file(fd_keys("medusa_heads."), str(out / "model.safetensors"))
    elif layout == "axolotl":
        # a full model directory: base weights + medusa_head.* keys, sharded with an index
        if base_dir is None:
            raise ValueError("the axolotl layout needs base_dir (it is a full model)")
        from safetensors.torch import load_file

        base_dir = Path(base_dir)
        base_sd = {}
        for f in sorted(base_dir.glob("*.safetensors")):
            base_sd.update(load_file(str(f)))
        cfg = json.loads((base_dir / "config.json").read_text())
        cfg.update({"medusa_num_heads": heads.num_heads, "medusa_num_layers": L})
        shards = [base_sd, fd_keys("medusa_head.")]
        index = {"metadata": {}, "weight_map": {}}
        for i, sd in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: v.contiguous() for k, v in sd.items()}, str(out / name))
            for k in sd:
                index["weight_map"][k] = name
        (out / "model.safetensors.index.json").write_text(json.dumps(index))
    elif layout == "vllm":
        sd = {}
        for h, row in enumerate(heads.blocks):
            for layer, (w, b) in enumerate(row):
                sd[f"blocks.{h}.layers.{layer}.weight"] = w.to(dtype).contiguous()
                sd[f"blocks.{h}.layers.{layer}.bias"] = b.to(dtype).contiguous()
            if heads.lm_heads is not None:
                sd[f"lm_heads.{h}.weight"] = heads.lm_heads[h].to(dtype).contiguous()
        save_file(sd, str(out / "model.safetensors"))
        vocab = heads.lm_heads[0].shape[0] if heads.lm_heads else None
        cfg = {"model_type": "medusa", "num_heads": heads.num_heads, "num_hidden_layers": L, "hidden_size": H,
               "vocab_size": vocab, "truncated_vocab_size": vocab, "original_lm_head": heads.lm_heads is None,
               "medusa_fc_bias": True}
    else:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(HEAD_LAYOUTS)}")
    if config_extra:
        cfg.update(config_extra)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
