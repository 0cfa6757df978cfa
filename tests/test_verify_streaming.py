"""verify in bounded memory: streaming (one decoder layer of each side at a time) gives the report the in-memory
mode gives, field for field, for every family at tp 2 (and at tp 1 for Llama and Qwen2), in float and weight-only;
the mode is chosen and reported; each side holds one unit of weights at a time (that a base four times a memory
allowance verifies within it: tests/test_memory_bounds.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import (
    convert_to,
    converted_once,
    family_checkpoint,
    heads_once,
    tiny_base,
    verified_once,
)

from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.errors import EXIT_FOUND, ModelError
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.huggingface.model import load_hf_model, release
from trtllm_medusa_ports.huggingface.streaming import WeightStore, placed, streamed_weights
from trtllm_medusa_ports.reference.executor import ReferenceModel, streaming_group
from trtllm_medusa_ports.verify import verify

TREE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"
CASES = family_test_cases()
#: every family once, in its first declared shape, and the families the other tests are built on
FAMILIES = list(dict.fromkeys([a for a, _ in CASES["variants"]] + ["LlamaForCausalLM", "Qwen2ForCausalLM"]))
#: widths weight-only accepts (multiples of 64 x tp_size: rule quant-weight-only-shape)
WIDE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _both_modes(base: Path, ckpt: Path) -> tuple[dict, dict]:
    """The in-memory report (once per run, kept as its JSON: conftest.verified_once; the families' tests assert on
    the same) and the streaming report of one shared checkpoint, as JSON dicts."""
    a = verified_once(base, ckpt, medusa_choices=TREE, max_new_tokens=4, streaming=False).to_dict()
    b = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, quiet=True, streaming=True).to_dict()
    assert a.pop("memory_mode")["mode"] == "in-memory" and b.pop("memory_mode")["mode"] == "streaming"
    return a, b


def _assert_same(a: dict, b: dict, context: str) -> None:
    assert a["parity"] and a["greedy_equal"] and a["tree_proof"]["ok"], context
    assert [k for k in a if a[k] != b[k]] == [], context
    # the figures to the last digit (the JSON text is the same), the greedy tokens, the accepted lengths
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), context


#: the families streamed at tp 1 as well: every family streams at tp 2, whose two ranks go through every path
#: one rank does (the transformers side streams the same units at any tp); tp 1's own layouts are the weight-only
#: test's and these two bases'
TP1_TOO = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@pytest.mark.parametrize("arch", FAMILIES)
def test_streaming_report_is_the_in_memory_report(arch):
    for tp in (1, 2) if arch in TP1_TOO else (2,):  # the families' own conversions (conftest.family_checkpoint)
        _assert_same(*_both_modes(*family_checkpoint(arch, tp)), f"{arch} tp={tp}")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM"])
def test_streaming_report_is_the_in_memory_report_weight_only(store, arch):
    """INT8 weight-only: transformers quantized as the checkpoint is, layer by layer in streaming (fused gate_up,
    stacked experts)."""
    base = tiny_base(store, arch, **WIDE)
    heads = heads_once(base)
    for tp in (1, 2) if arch != "MixtralForCausalLM" else (2,):  # the experts' tp-1 layout is tp 2's unsplit
        ckpt = converted_once(base, heads, tp_size=tp, dtype="bfloat16", use_weight_only=True)
        a, b = _both_modes(base, ckpt)
        assert a["quantization"] and a["quant_effect"]["max_abs_diff"] > 1e-4  # the quantization was computed
        _assert_same(a, b, f"{arch} tp={tp}")


@pytest.fixture(scope="module")
def llama_ckpt():
    return family_checkpoint("LlamaForCausalLM", 2)  # read-only, shared by the run


def test_the_mode_is_chosen_by_max_memory_and_reported(llama_ckpt):
    base, ckpt = llama_ckpt
    small = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=2, quiet=True, max_memory=1e-3)
    large = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=2, quiet=True, max_memory=1000)
    asked = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=2, quiet=True, max_memory=1e-3, streaming=False)
    m = small.memory_mode
    assert m["mode"] == "streaming" and m["reason"] == "the in-memory estimate exceeds --max_memory 0.001 GB"
    assert m["estimated_in_memory_bytes"] > m["max_memory_bytes"] == 10**6
    assert 0 < m["largest_unit_bytes"] < m["float32_bytes"] and m["device"] == "cpu"
    assert large.memory_mode["mode"] == "in-memory" and "fits --max_memory 1000 GB" in large.memory_mode["reason"]
    assert asked.memory_mode["mode"] == "in-memory" and asked.memory_mode["reason"] == "--no_streaming"
    assert "memory            : streaming on cpu (the in-memory estimate exceeds --max_memory 0.001 GB)" in \
        small.render()
    assert json.loads(json.dumps(small.to_dict()))["memory_mode"]["mode"] == "streaming"


@pytest.mark.parametrize("kw, needle", [(dict(max_memory=0.0), "--max_memory 0.0 must be a positive number"),
                                        (dict(device="cuda:99"), "--device cuda:99"),
                                        (dict(device="tpu"), "'tpu' is not a torch device")])
def test_bad_memory_and_device_options_are_refused(llama_ckpt, kw, needle):
    base, ckpt = llama_ckpt
    with pytest.raises(ModelError) as e:
        verify(base, ckpt, max_new_tokens=2, quiet=True, **kw)
    assert needle in str(e.value) and e.value.fix


def test_streaming_refuses_a_quantization_it_does_not_emulate(tmp_path, store):
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"input_ids": [i, i + 1, i + 2, i + 3]}) + "\n" for i in range(1, 7)))
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), dtype="float16", qformat="fp8",
                      calib_dataset=calib, calib_size=6)
    for kw in (dict(streaming=True), dict(max_memory=1e-3)):
        with pytest.raises(ModelError) as e:
            verify(base, ckpt, max_new_tokens=2, quiet=True, **kw)
        assert "FP8" in str(e.value) and "weight-only quantization only" in str(e.value)
        assert "--no_streaming" in e.value.fix


def test_the_executor_streaming_holds_one_group_at_a_time(llama_ckpt):
    _, ckpt = llama_ckpt
    kept: list[set] = []

    def watched(ref):
        original = ref._kept

        def kept_now(cache, rank, name):
            out = original(cache, rank, name)
            kept.append({(r, streaming_group(n)) for r, n in list(ref._weights) + list(ref._stored)})
            return out
        ref._kept = kept_now
        return ref

    whole = ReferenceModel(read_checkpoint(ckpt))
    streamed = watched(ReferenceModel(read_checkpoint(ckpt), streaming=True))
    prompt = [3, 5, 7, 9]
    a, _ = whole.forward(prompt, whole.new_cache())
    b, _ = streamed.forward(prompt, streamed.new_cache())
    assert torch.equal(a, b)
    assert max(len(k) for k in kept) == 1  # at most the group being read
    groups = {(r, streaming_group(n)) for r, n in list(whole._weights) + list(whole._stored)}
    assert len(groups) == 8 and streamed.group_loads >= len(groups)  # every group read, none kept
    before = streamed.group_loads
    streamed.forward(prompt, streamed.new_cache())
    assert streamed.group_loads - before == before  # each forward pass reads them again, in the same order


def test_the_streamed_base_holds_one_unit_at_a_time(tmp_path, store):
    base = tiny_base(store, "Qwen2MoeForCausalLM")
    model = load_hf_model(base, torch.bfloat16, streaming=True, offload_dir=tmp_path)
    streamed = streamed_weights(model)
    assert list(tmp_path.iterdir()) == []  # the weight file is unlinked at once
    assert all(p.device.type == "meta" for p in model.parameters())
    real: list[int] = []

    def count(_m, _a):
        real.append(sum(p.numel() for p in model.parameters() if p.device.type != "meta"))
    for unit in streamed.units:
        unit.module.register_forward_pre_hook(count)
    with torch.no_grad():
        model(input_ids=torch.tensor([[3, 4, 5]]))
    names = [u.name for u in streamed.units]
    assert names[0] == "model.embed_tokens" and "model.layers.1" in names and names[-1] == "lm_head"
    largest = max(sum(p.numel() for p in u.module.parameters()) for u in streamed.units)
    assert len(real) == len(streamed.units) and 0 < max(real) <= largest  # only the unit that runs
    assert all(p.device.type == "meta" for p in model.parameters())
    assert streamed.loads == len(streamed.units)
    def expert_weight(layer: int):  # transformers 5 stacks the experts (gate_up_proj); 4.57 keeps a list of MLPs
        experts = model.model.layers[layer].mlp.experts
        return experts.gate_up_proj if hasattr(experts, "gate_up_proj") else experts[0].gate_proj.weight

    with streamed.materialized(model.model.layers[1].mlp):
        assert expert_weight(1).device.type == "cpu" and expert_weight(0).device.type == "meta"
    with pytest.raises(ModelError, match="not in place"):
        streamed.persist(model.lm_head)
    release(model)
    with pytest.raises(OSError):
        os.fstat(streamed.store._fd)


def test_weight_store_keeps_values_and_their_alignment(tmp_path):
    store = WeightStore(tmp_path)
    exact = torch.randn(5, 7).to(torch.bfloat16).float()
    full = torch.randn(33)
    odd = torch.randn(20)[2:]  # 8 bytes past an aligned start
    for k, t in (("exact", exact), ("full", full), ("odd", odd), ("empty", torch.zeros(0, 4))):
        store.put(k, t)
    assert store.nbytes == 5 * 7 * 2 + 33 * 4 + 18 * 4  # bfloat16 where exact, float32 otherwise
    for k, t in (("exact", exact), ("full", full), ("odd", odd)):
        assert torch.equal(store.get(k), t) and store.get(k).dtype == torch.float32
    assert store.get("empty").shape == (0, 4)
    assert store.alignment("odd") == odd.data_ptr() % 64 == (store.alignment("full") + 8) % 64
    assert placed(store.get("odd"), store.alignment("odd"), torch.device("cpu")).data_ptr() % 64 == \
        odd.data_ptr() % 64
    store.put("full", full * 2)  # rewritten in place: same size
    assert torch.equal(store.get("full"), full * 2) and store.nbytes == 5 * 7 * 2 + 33 * 4 + 18 * 4
    store.close()


def test_verify_cli_streaming_json(llama_ckpt, capsys):
    from trtllm_medusa_ports.cli import main

    base, ckpt = llama_ckpt
    rc = main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--max_new_tokens", "2",
               "--medusa_choices", TREE, "--streaming", "--device", "cpu", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    # float32 (exact): proven, and not servable (rule dtype-float32), so exit 3 (verify FAILED)
    assert rc == EXIT_FOUND and out["proof_ok"] and not out["ok"] and out["memory_mode"]["mode"] == "streaming"
    assert [r[: len("[dtype-float32]")] for r in out["build_refusals"]] == ["[dtype-float32]"]
    assert out["memory_mode"]["reason"] == "--streaming"
    with pytest.raises(SystemExit):
        main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--streaming", "--no_streaming"])
