"""verify in bounded memory: streaming (one decoder layer of each side at a time) gives the report the in-memory
mode gives, field for field, for every family at tp 1 and 2, in float and weight-only; the mode is chosen and
reported; each side holds one unit of weights at a time; and a base four times a memory allowance verifies
within it (peak resident memory of a child process, see ``test_a_base_four_times_the_allowance_...``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ANON_SAMPLER, convert_to, tiny_base

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.base_model import base_float32_bytes, load_hf_model, release
from trtllm_medusa_ports.base_streaming import WeightStore, placed, streamed_weights
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base
from trtllm_medusa_ports.reference.executor import ReferenceModel, streaming_group
from trtllm_medusa_ports.verify import verify

TREE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"
CASES = family_test_cases()
#: every family once, in its first declared shape, and the families the other tests are built on
FAMILIES = list(dict.fromkeys([a for a, _ in CASES["variants"]] + ["LlamaForCausalLM", "Qwen2ForCausalLM"]))
#: widths weight-only accepts (multiples of 64 x tp_size: rule quant-weight-only-shape)
WIDE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _heads(base: Path, out: Path) -> Path:
    hf = HFConfig.read(base)
    return save_heads(random_heads(adapter_for(hf.architecture).hidden_size(hf), hf.get("vocab_size"), num_heads=3,
                                   seed=11), out)


def _both_modes(base: Path, ckpt: Path, **kw) -> tuple[dict, dict]:
    """The in-memory and the streaming report of one checkpoint, as JSON dicts."""
    a = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, quiet=True, streaming=False, **kw).to_dict()
    b = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, quiet=True, streaming=True, **kw).to_dict()
    assert a.pop("memory_mode")["mode"] == "in-memory" and b.pop("memory_mode")["mode"] == "streaming"
    return a, b


def _assert_same(a: dict, b: dict, context: str) -> None:
    assert a["parity"] and a["greedy_equal"] and a["tree_proof"]["ok"], context
    assert [k for k in a if a[k] != b[k]] == [], context
    # the figures to the last digit (the JSON text is the same), the greedy tokens, the accepted lengths
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), context


@pytest.mark.parametrize("arch", FAMILIES)
def test_streaming_report_is_the_in_memory_report(tmp_path, store, arch):
    base = tiny_base(store, arch)
    heads = _heads(base, tmp_path / "h")
    for tp in (1, 2):
        ckpt = convert_to(tmp_path / f"tp{tp}", base, heads, tp_size=tp, allow_unsupported=arch in CASES["unsupported"])
        _assert_same(*_both_modes(base, ckpt), f"{arch} tp={tp}")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM"])
def test_streaming_report_is_the_in_memory_report_weight_only(tmp_path, store, arch):
    """INT8 weight-only: transformers quantized as the checkpoint is, layer by layer in streaming (fused gate_up,
    stacked experts)."""
    base = tiny_base(store, arch, **WIDE)
    heads = _heads(base, tmp_path / "h")
    for tp in (1, 2) if arch != "MixtralForCausalLM" else (2,):  # the experts' tp-1 layout is tp 2's unsplit
        ckpt = convert_to(tmp_path / f"tp{tp}", base, heads, tp_size=tp, dtype="bfloat16", use_weight_only=True)
        a, b = _both_modes(base, ckpt)
        assert a["quantization"] and a["quant_effect"]["max_abs_diff"] > 1e-4  # the quantization was computed
        _assert_same(a, b, f"{arch} tp={tp}")


@pytest.fixture(scope="module")
def llama_ckpt(store, tmp_path_factory):
    base = tiny_base(store, "LlamaForCausalLM")
    out = tmp_path_factory.mktemp("streaming")
    return base, convert_to(out / "ckpt", base, _heads(base, out / "h"), tp_size=2)


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
    ckpt = convert_to(tmp_path / "c", base, _heads(base, tmp_path / "h"), dtype="float16", qformat="fp8",
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
    with streamed.materialized(model.model.layers[1].mlp):
        w = model.model.layers[1].mlp.experts.gate_up_proj
        assert w.device.type == "cpu" and model.model.layers[0].mlp.experts.gate_up_proj.device.type == "meta"
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
    assert rc == 0 and out["ok"] and out["memory_mode"]["mode"] == "streaming"
    assert out["memory_mode"]["reason"] == "--streaming"
    with pytest.raises(SystemExit):
        main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--streaming", "--no_streaming"])


# -- memory: a base four times the allowance ----------------------------------------------------------------
#: run in a child: verify each (base, checkpoint, streaming) in turn and print each run's peak anonymous resident
#: memory (RssAnon, sampled every millisecond: what a memory limit cannot reclaim, where the file pages
#: transformers maps while loading are clean and reclaimable) and the process's ru_maxrss
_CHILD = ANON_SAMPLER + textwrap.dedent("""
    import resource
    from trtllm_medusa_ports.verify import verify
    out = []
    for base, ckpt, streaming in json.loads(sys.argv[1]):
        peak[0] = anon()
        rep = verify(base, ckpt, prompts=[[5, 6, 7, 8, 9, 10]], max_new_tokens=2, medusa_choices="[[0],[1]]",
                     quiet=True, threads=1, streaming=streaming, skip_tree_proof=True)
        out.append({"ok": rep.ok, "mode": rep.memory_mode["mode"], "peak_anon": max(peak[0], anon())})
    print(json.dumps({"runs": out, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""")


def _peaks(runs: list[tuple[Path, Path, bool]]) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    arg = json.dumps([[str(b), str(c), s] for b, c, s in runs])
    out = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["runs"]


def test_a_base_four_times_the_allowance_verifies_within_it_streaming(tmp_path):
    """A 12-layer base (50 MB in float32) after the same base with one layer, in one process: the 12-layer run's
    peak memory above the one-layer run's (the libraries, transformers' model code, buffers, the process's own
    heap: what no mode avoids) stays under a quarter of the base's float32 size streaming, and exceeds it in
    memory (the allowance binds). Peak RssAnon, sampled: a virtual-memory cap (``prlimit --as``) binds on the
    address space torch, its thread arenas and the libraries reserve (0.67 GB before any model), not on the
    model, so it cannot tell the modes apart at a size a test can build."""
    widths = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                  vocab_size=512, tie_word_embeddings=False)
    made = {}
    for layers in (1, 12):
        base = save_tiny_base("LlamaForCausalLM", tmp_path / f"b{layers}", seed=layers, dtype=torch.bfloat16,
                              num_hidden_layers=layers, **widths)
        heads = save_heads(random_heads(256, 512, num_heads=2, seed=1, own_lm_head=False), tmp_path / f"h{layers}",
                           "fasterdecoding-v2")
        made[layers] = (base, convert_to(tmp_path / f"c{layers}", base, heads, dtype="bfloat16"))
    float32 = base_float32_bytes(made[12][0])
    assert 48e6 < float32 < 56e6
    allowance = float32 / 4
    fixed, streamed, whole = _peaks([(*made[1], True), (*made[12], True), (*made[12], False)])
    assert fixed["ok"] and streamed["ok"] and whole["ok"]
    assert (streamed["mode"], whole["mode"]) == ("streaming", "in-memory")
    assert streamed["peak_anon"] - fixed["peak_anon"] < allowance, (streamed, fixed, allowance)
    assert whole["peak_anon"] - fixed["peak_anon"] > allowance, (whole, fixed, allowance)
