"""Engine adapters and ``trtllm-medusa build`` against the TensorRT-LLM stand-in (tests/standin).

The stand-in models upstream's build route (LEDGER.md beside it): MODEL_MAP and config_class
per family, ``PretrainedConfig.from_dict``, ``commands/build.py`` ``parallel_build`` ->
``build_model`` -> ``from_checkpoint`` -> strict ``load`` -> ``builder.build`` ->
``prepare_inputs`` + ``forward``. Every supported family's converted checkpoint goes through
it; the second half of this file shows that it fails on each bug it exists to catch.
"""

import copy
import json
import shutil
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import built_once, convert_to, run_store, tiny_base
from safetensors.torch import load_file, save_file
from standin_import import drop_standin, standin_installed

from trtllm_medusa_ports.archs import adapter_for, registry
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.files.hf_model import HFConfig, assign
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

ALIBI = {a for a, cls in registry().items() if cls.position_embedding is PositionEmbedding.ALIBI}
# one architecture per adapter class (RWForCausalLM and MPTForCausalLM are second names): every family but the
# ALiBi ones (RoPE and learned positions); tests of RoPE fields key on the family's own position kind
NON_ALIBI_FAMILIES = sorted({cls.hf_architectures[0] for cls in registry().values()} - ALIBI)


_drop_trtllm = drop_standin


@pytest.fixture
def trtllm():
    """A pristine stand-in for each test (fresh modules, CALLS and our class registry empty), imported through
    tests/standin_import.py's finder, which compiles each file once per process instead of once per test."""
    with standin_installed() as tensorrt_llm:
        yield tensorrt_llm


def _heads(hidden: int, vocab: int) -> Path:
    """Two random heads for a base's sizes, saved once per test run (read-only)."""
    return built_once(run_store() / f"engine-heads-{hidden}-{vocab}",
                      lambda d: save_heads(random_heads(hidden, vocab, num_heads=2, seed=3), d))


def _checkpoint(store, tmp_path, arch, tp=1, pp=1, name="ckpt", base=None, **convert_kw):
    """``arch``'s tiny base (or ``base``) with two heads, converted. From a shared base (conftest.tiny_base), once
    per test run for these parameters and shared read-only by every test that asks (conftest fails a test that
    writes into it: one that changes the checkpoint takes :func:`_own_checkpoint`'s copy); from a base of the
    test's own, into ``tmp_path / name``."""
    base = base or tiny_base(store, arch)
    hf = HFConfig.read(base)
    ad = adapter_for(arch)
    heads = _heads(ad.hidden_size(hf), hf.get("vocab_size"))
    # Gemma 2/3 overflow float16 (rule float16-range, which build enforces): bfloat16 as they are published
    convert_kw.setdefault("dtype", "bfloat16" if ad.float16_unsafe else "float16")
    kw = dict(tp_size=tp, pp_size=pp, allow_unsupported=arch in family_test_cases()["unsupported"], **convert_kw)
    if Path(base).parent != run_store():
        return convert_to(tmp_path / name, base, heads, **kw)
    key = json.dumps(kw, sort_keys=True, default=str)
    return built_once(run_store() / f"engine-ckpt-{arch}-{Path(base).name}-{zlib.crc32(key.encode()):08x}",
                      lambda d: convert_to(d, base, heads, **kw))


def _own_checkpoint(store, tmp_path, arch, tp=1, pp=1, name="ckpt", base=None, **convert_kw):
    """:func:`_checkpoint`'s checkpoint, copied into ``tmp_path / name`` for a test that changes it."""
    return Path(shutil.copytree(_checkpoint(store, tmp_path, arch, tp, pp, name, base, **convert_kw),
                                tmp_path / name))


def _build(ckpt, out, *flags):
    return main(["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(out), *flags])


def _per_rank(calls):
    """CALLS split at each ("build", architecture, class, rank) marker: rank -> calls before it."""
    out, current = {}, []
    for c in calls:
        if c[0] == "build":
            out[c[3]] = (c, current)
            current = []
        else:
            current.append(c)
    return out


def _engine_model(ckpt, rank=0):
    """The model trtllm-medusa build would build for one rank (stand-in), loaded from the checkpoint."""
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.engine.build import model_config_and_class

    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    model_config, cls = model_config_and_class(cfg)
    rank_config = copy.deepcopy(model_config)
    rank_config.set_rank(rank)
    return (cls or MODEL_MAP[cfg["architecture"]]).from_checkpoint(str(ckpt), config=rank_config)


def test_tensorrt_llm_is_not_importable_in_ci():
    _drop_trtllm()
    with pytest.raises(ImportError):
        __import__("tensorrt_llm")


# -- every family through the real route -----------------------------------------------------------
def _layouts():
    out = []
    for arch in NON_ALIBI_FAMILIES:
        out += [(arch, 1, 1), (arch, 2, 1)]
        if adapter_for(arch).engine_pipeline_parallel:
            out.append((arch, 1, 2))
    return out


@pytest.mark.parametrize("arch, tp, pp", _layouts(), ids=[f"{a}-tp{t}-pp{p}" for a, t, p in _layouts()])
def test_every_family_builds_through_upstreams_route(trtllm, store, tmp_path, arch, tp, pp):
    from tensorrt_llm.builder import EngineConfig
    from tensorrt_llm.layers import SpecDecodingParams
    from tensorrt_llm.models import MODEL_MAP

    ckpt = _checkpoint(store, tmp_path, arch, tp, pp)
    cfg = json.loads((ckpt / "config.json").read_text())
    map_before = dict(MODEL_MAP)
    assert _build(ckpt, tmp_path / "eng", "--max_batch_size", "2") == 0
    assert MODEL_MAP == map_before  # nothing registered, nothing patched

    builds = _per_rank(trtllm.CALLS)
    assert sorted(builds) == list(range(tp * pp))
    n_layers = cfg["num_hidden_layers"]
    for rank, ((_, _, cls_name, _), calls) in builds.items():
        expected_cls = "MedusaForCausalLm" if cfg["architecture"] == "MedusaForCausalLM" else cfg["architecture"]
        assert cls_name == expected_cls
        prep = [c for c in calls if c[0] == "prepare_inputs"]
        assert prep == [("prepare_inputs", {"max_draft_len": cfg["max_draft_len"], "external": False})]
        # every decoder layer of this stage got the very SpecDecodingParams object the inputs carry
        att = [c for c in calls if c[0] == "attention"]
        stage_layers = len([i for i in range(n_layers)]) // pp + (1 if rank // tp < n_layers % pp else 0)
        assert [c[1] for c in att] == list(range(stage_layers))
        assert all(isinstance(c[2], SpecDecodingParams) and c[2] is att[0][2] for c in att)
        engine = json.loads((tmp_path / "eng" / f"rank{rank}.engine").read_text())
        last = rank // tp == pp - 1
        assert ("medusa_logits" in engine["outputs"]) == last and ("logits" in engine["outputs"]) == last
        assert ("hidden_states_output" in engine["outputs"]) == (not last)
        assert any(n.startswith("medusa_heads.1.") for n in engine["parameters"]) == last

    # what the runtime reads: resolvable without our package, Medusa fields present
    eng = EngineConfig.from_json_file(str(tmp_path / "eng" / "config.json"))
    assert eng.pretrained_config.architecture in MODEL_MAP
    assert eng.pretrained_config.num_medusa_heads == 2 and eng.pretrained_config.max_draft_len == cfg["max_draft_len"]
    assert eng.build_config["speculative_decoding_mode"] == "medusa"
    if cfg["architecture"] != "MedusaForCausalLM":  # the engine's name for the base (archs/base.py)
        assert eng.pretrained_config.architecture == adapter_for(arch).base_architecture(arch)


def test_a_post_norm_opt_builds_without_a_final_norm(trtllm, store, tmp_path):
    """OPT with do_layer_norm_before false (issue 79): the checkpoint holds no ln_f and the engine class builds none
    (upstream's OPTModel builds ln_f only for pre-norm layers), every parameter loaded, every attention layer given
    the tree's SpecDecodingParams by the plumbing."""
    from tensorrt_llm.layers import SpecDecodingParams

    base = tiny_base(store, "OPTForCausalLM", do_layer_norm_before=False)
    ckpt = _checkpoint(store, tmp_path, "OPTForCausalLM", tp=2, base=base)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["do_layer_norm_before"] is False
    from safetensors import safe_open

    with safe_open(str(ckpt / "rank0.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "ln_f" in k]
    assert _build(ckpt, tmp_path / "eng", "--max_batch_size", "2") == 0
    att = [c for c in trtllm.CALLS if c[0] == "attention"]
    assert att and all(isinstance(c[2], SpecDecodingParams) for c in att)
    model = _engine_model(ckpt, 1)
    assert not hasattr(model.transformer, "ln_f") and all(p.is_inited() for _, p in model.named_parameters())


@pytest.mark.parametrize("arch", sorted({registry()[a].hf_architectures[0] for a in ALIBI}))
def test_alibi_families_still_load_into_their_engine_class(trtllm, store, tmp_path, arch):
    """build refuses ALiBi (XQA has none); the checkpoint written with --allow_unsupported still
    matches the class name for name and shape (Bloom's share_embedding_table included)."""
    ckpt = _checkpoint(store, tmp_path, arch, tp=2)
    assert _build(ckpt, tmp_path / "eng") == 1
    for rank in (0, 1):
        model = _engine_model(ckpt, rank)
        assert type(model).__name__ == adapter_for(arch).ported_architecture()
        assert all(p.is_inited() for _, p in model.named_parameters())
    if arch == "BloomForCausalLM":
        assert json.loads((ckpt / "config.json").read_text())["share_embedding_table"] is False


def test_paged_and_continuous_kv_cache_and_worker_processes(trtllm, store, tmp_path):
    ckpt = _checkpoint(store, tmp_path, "GemmaForCausalLM", tp=2)
    assert _build(ckpt, tmp_path / "eng", "--kv_cache_type", "continuous", "--workers", "2") == 0
    for rank in (0, 1):  # workers > 1: the class and its config went through pickle
        assert "medusa_logits" in json.loads((tmp_path / "eng" / f"rank{rank}.engine").read_text())["outputs"]


def test_head_activation_and_shared_lm_head_follow_config(trtllm, store, tmp_path):
    own = _engine_model(_checkpoint(store, tmp_path, "PhiForCausalLM", name="own"))
    assert all(layer.act == "silu" for h in own.medusa_heads for layer in h.medusa_layers)  # never the base gelu
    assert all(hasattr(h, "lm_head") for h in own.medusa_heads)
    shared_ckpt = _checkpoint(store, tmp_path, "PhiForCausalLM", name="shared", share_lm_head=True)
    shared = _engine_model(shared_ckpt)
    assert not any(n.startswith("medusa_heads.0.lm_head") for n, _ in shared.named_parameters())
    trtllm.CALLS.clear()
    assert _build(shared_ckpt, tmp_path / "eng") == 0
    lm_head_calls = [c for c in trtllm.CALLS if c[0] == "linear" and c[2] == 256]
    assert len(lm_head_calls) == 1 + 2  # base logits, then once per head through the base lm_head


def test_family_config_sees_the_base_architecture(trtllm, store, tmp_path):
    model = _engine_model(_checkpoint(store, tmp_path, "Gemma3ForCausalLM"))
    # GemmaConfig keys Gemma 3 behaviour on `architecture`: q/k norms, local layers, q_scaling
    assert model.config.architecture == "Gemma3ForCausalLM" and model.config.is_gemma_3
    att = [layer.attention for layer in model.transformer.layers]
    assert all(a.qk_layernorm for a in att) and [a.is_local for a in att] == [True, False]


def test_build_without_tensorrt_llm_exits_1_with_hint(store, tmp_path, capsys):
    from trtllm_medusa_ports.machine.gpu_machine import INSTALL_COMMAND

    _drop_trtllm()
    rc = _build(_checkpoint(store, tmp_path, "GemmaForCausalLM"), tmp_path / "x")
    err = capsys.readouterr().err
    assert rc == 1 and "TensorRT-LLM is not installed" in err and INSTALL_COMMAND in err
    assert "Traceback" not in err


@pytest.mark.parametrize("edit, rule", [({"position_embedding_type": "alibi", "model_type": "bloom"},
                                         "alibi-position-embedding"),
                                        # the MPT class applies ALiBi whatever position_embedding_type says
                                        ({"position_embedding_type": "learned_absolute",
                                          "base_architecture": "MptForCausalLM"}, "alibi-position-embedding"),
                                        ({"dtype": "float32"}, "dtype-float32"),
                                        ({"num_medusa_heads": 0}, "not-medusa")])
def test_build_runs_the_checks_first(trtllm, store, tmp_path, capsys, edit, rule):
    ckpt = _own_checkpoint(store, tmp_path, "GemmaForCausalLM")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, **edit}))
    assert _build(ckpt, tmp_path / "eng") == 1 and rule in capsys.readouterr().err
    assert not [c for c in trtllm.CALLS if c[0] == "build"]


def test_build_refuses_a_model_class_override(trtllm, store, tmp_path, capsys):
    ckpt = _checkpoint(store, tmp_path, "GemmaForCausalLM")
    assert _build(ckpt, tmp_path / "eng", "--model_cls_name", "X") == 1
    assert "--model_cls_file/--model_cls_name" in capsys.readouterr().err


def test_build_json_prints_one_object_built_or_not(trtllm, store, tmp_path, capsys):
    """build --json (issue 76, D): the result as JSON where it built, one failure object where anything stopped it
    (a rule, a flag, TensorRT-LLM); --json is build's own flag, never passed on to trtllm-build."""
    ckpt = _checkpoint(store, tmp_path, "GemmaForCausalLM")
    assert _build(ckpt, tmp_path / "eng", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"checkpoint_dir": str(ckpt), "returncode": 0, "ok": True}
    assert _build(ckpt, tmp_path / "eng2", "--model_cls_name", "X", "--json") == 1
    failure = json.loads(capsys.readouterr().out)
    assert failure["exit_code"] == 1 and failure["where"] == "--model_cls_file/--model_cls_name"
    bad = _own_checkpoint(store, tmp_path, "GemmaForCausalLM")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "dtype": "float32"}))
    assert _build(bad, tmp_path / "eng3", "--json") == 1
    failure = json.loads(capsys.readouterr().out)
    assert failure["rules"] == ["dtype-float32"] and failure["exit_code"] == 1


# -- keys the adapters write reach the engine class under upstream's names --------------------------
#: keys written for people and tools, not for the engine class: provenance, and upstream's own
#: convention (model_type, which only upstream MedusaConfig reads)
NOT_FOR_THE_CLASS = {"base_architecture", "trtllm_base_architecture", "medusa_ports", "model_type", "sliding_window"}


@pytest.mark.parametrize("arch", NON_ALIBI_FAMILIES)
def test_every_key_an_adapter_writes_is_read_by_the_build(trtllm, store, tmp_path, arch):
    """A key the engine class never reads is a typo or a dead field: either way the engine
    silently uses a default. The stand-in records which implicitly set keys are read."""
    ckpt = _checkpoint(store, tmp_path, arch)
    cfg = json.loads((ckpt / "config.json").read_text())
    trtllm.CALLS.clear()
    assert _build(ckpt, tmp_path / "eng") == 0
    implicit = {k for c in trtllm.CALLS if c[0] == "config_implicit" for k in c[1]}
    read = {c[1] for c in trtllm.CALLS if c[0] == "config_read"}
    allowed = set(NOT_FOR_THE_CLASS)
    if cfg["architecture"] == "MedusaForCausalLM":  # upstream's class: SiLU heads, own lm_heads (naming rule)
        allowed |= {"medusa_hidden_act", "medusa_shared_lm_head"}
    assert implicit and not implicit - read - allowed, sorted(implicit - read - allowed)


def _set(cfg, **kw):
    """Non-default values in a saved HF config.json (transformers 5 nests RoPE in rope_parameters)."""
    params = cfg.get("rope_parameters")
    for k, v in kw.items():
        if k in ("rope_theta", "partial_rotary_factor") and isinstance(params, dict):
            params[k] = v
        else:  # a dotted key is a path into a nested object (files/hf_model.py)
            assign(cfg, k, v)
    return cfg


#: (architecture, tiny architecture, values): every family's ArchAdapter.key_cases, aliases included
KEY_CASES = {arch: (tiny, keys) for arch, tiny, keys in family_test_cases()["key_cases"]}


@pytest.mark.parametrize("arch", sorted(KEY_CASES))
def test_keys_reach_the_engine_class_with_non_default_values(trtllm, store, tmp_path, arch):
    """A key written under a name the class does not read (``rotary_emb_base`` vs ``rotary_base``,
    ``rotary_pct`` vs ``partial_rotary_factor``) silently takes upstream's default; here every
    value differs from the default, so a typo fails."""
    tiny_arch, want = KEY_CASES[arch]
    base_src = tiny_base(store, tiny_arch)
    base = tmp_path / "base"
    base.mkdir()
    for f in base_src.iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((base / "config.json").read_text())
    cfg["architectures"] = [arch]
    (base / "config.json").write_text(json.dumps(_set(cfg, **want)))
    ckpt = _checkpoint(store, tmp_path, arch, base=base)
    model = _engine_model(ckpt)
    written = json.loads((ckpt / "config.json").read_text())
    hf = HFConfig.read(base)
    layers = list(model.transformer.layers)
    att = layers[0].attention
    adapter = adapter_for(arch)
    if adapter.rope_theta_key in want:  # the family's own RoPE key (DBRX's attn_config.rope_theta)
        base_theta = want[adapter.rope_theta_key]
        assert all(layer.attention.rotary_embedding_base == base_theta for layer in layers)
        assert model.rotary_tables["base"] == base_theta  # the tables the kernels read
    if adapter_for(arch).position_embedding.is_rope:  # GPT-J counts rotated features, the others a head's share
        pct = want.get("partial_rotary_factor", adapter_for(arch).rotary_fraction(hf))
        rotary = want.get("rotary_dim") or hf.get("rotary_dim") or int(written["head_size"] * pct)
        assert model.rotary_tables["dim"] == rotary
    if "partial_rotary_factor" in want:
        assert att.rotary_embedding_percentage == want["partial_rotary_factor"]
    if arch == "Gemma3ForCausalLM":
        assert model.rotary_tables["local_base"] == hf.get("rope_local_base_freq", 10000.0)
    eps = want.get(adapter_for(arch).norm_epsilon_key)  # the family's own epsilon key
    if eps:
        assert layers[0].input_layernorm.eps == eps
    if adapter.experts_per_token_key in want:  # the experts' router reads the MoE config the checkpoint holds
        assert all(layer.mlp.top_k == want[adapter.experts_per_token_key] for layer in layers)
    if "query_pre_attn_scalar" in want:
        assert abs(att.q_scaling - (64 / written["head_size"]) ** 0.5) < 1e-12
    if arch == "Qwen2ForCausalLM":
        assert model.config.seq_length == 777
    assert att.num_attention_heads == adapter.num_attention_heads(hf)
    assert att.attention_head_size == written["head_size"]
    assert all(p.is_inited() for _, p in model.named_parameters())


def test_phi3_longrope_fields_reach_attention(trtllm, store, tmp_path):
    base_src = tiny_base(store, "Phi3ForCausalLM")
    base = tmp_path / "base"
    base.mkdir()
    for f in base_src.iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((base / "config.json").read_text())
    half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=10000.0, original_max_position_embeddings=64, max_position_embeddings=256,
               rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 10 for i in range(half)],
                             "long_factor": [2.0 + i / 10 for i in range(half)]})
    (base / "config.json").write_text(json.dumps(cfg))
    att = _engine_model(_checkpoint(store, tmp_path, "Phi3ForCausalLM", base=base)).transformer.layers[0].attention
    assert att.position_embedding_type == "long_rope"
    assert list(att.rope_scaling_short_factors) == [1.0 + i / 10 for i in range(half)]
    assert list(att.rope_scaling_long_factors) == [2.0 + i / 10 for i in range(half)]


# -- Phi-3's fused gate_up at tp 2, computed on the stand-in's MLP ----------------------------------
def test_phi3_fused_gate_up_is_right_per_rank_and_a_plain_split_is_not(trtllm, store, tmp_path):
    """``layers/mlp.py`` MLP applies swiglu to the *rank-local* fc output (first half x, second
    half silu'd), so rank r needs ``[up_r; gate_r]``: what the converter writes. The plain dim-0
    split of ``[up; gate]`` that phi3/split_weights.py performs gives rank 0 only ``up``."""
    from tensorrt_llm.functional import Tensor
    from tensorrt_llm.layers import MLP
    from transformers import AutoModelForCausalLM

    base = tiny_base(store, "Phi3ForCausalLM")
    ckpt = _checkpoint(store, tmp_path, "Phi3ForCausalLM", tp=2, dtype="float32")
    hf_mlp = AutoModelForCausalLM.from_pretrained(base).model.layers[0].mlp
    cfg = json.loads((ckpt / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    x = torch.randn(5, hidden)

    def run(fc_of_rank, proj_of_rank):
        total = 0
        for r in range(2):
            mlp = MLP(hidden, inter, "swiglu", bias=False, tp_size=2)
            mlp.fc.weight.value, mlp.proj.weight.value = fc_of_rank(r), proj_of_rank(r)
            total = total + mlp(Tensor("x", x)).value  # + = the all-reduce after RowLinear
        return total

    ranks = [load_file(str(ckpt / f"rank{r}.safetensors")) for r in (0, 1)]
    fc = "transformer.layers.0.mlp.fc.weight"
    proj = "transformer.layers.0.mlp.proj.weight"
    with torch.no_grad():
        expected = hf_mlp(x)
    ours = run(lambda r: ranks[r][fc], lambda r: ranks[r][proj])
    assert torch.allclose(ours, expected, atol=1e-5)
    fused = torch.cat([ranks[0][fc].chunk(2)[0], ranks[1][fc].chunk(2)[0],
                       ranks[0][fc].chunk(2)[1], ranks[1][fc].chunk(2)[1]])  # [up; gate] unsplit
    plain = run(lambda r: fused.chunk(2)[r], lambda r: ranks[r][proj])
    assert not torch.allclose(plain, expected, atol=1e-2)


# -- the stand-in is upstream's, strictness included --------------------------------------------------
def test_standin_config_class_exactly_where_upstream_has_one(trtllm):
    from tensorrt_llm.models import MODEL_MAP

    without = {c.__name__ for c in MODEL_MAP.values() if not hasattr(c, "config_class")}
    declared = {cls.trtllm_base_class for cls in registry().values() if not cls.upstream_config_class}
    assert without == declared and {"GPTNeoXForCausalLM", "OPTForCausalLM"} <= declared


def test_standin_from_dict_dispatches_on_architecture(trtllm):
    from tensorrt_llm.models.gemma.model import GemmaConfig
    from tensorrt_llm.models.modeling_utils import PretrainedConfig

    base = dict(dtype="float16", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
                mapping={"world_size": 2, "tp_size": 2, "pp_size": 1})
    cfg = PretrainedConfig.from_dict({**base, "architecture": "GemmaForCausalLM"})
    assert type(cfg) is GemmaConfig and cfg.mapping.tp_size == 2 and cfg.use_parallel_embedding is True
    assert type(PretrainedConfig.from_dict({**base, "architecture": "GPTNeoXForCausalLM"})) is PretrainedConfig
    with pytest.raises(KeyError, match="MedusaPortsGemmaForCausalLM"):
        PretrainedConfig.from_dict({**base, "architecture": "MedusaPortsGemmaForCausalLM"})
    with pytest.raises(TypeError, match="hidden_size"):
        PretrainedConfig(architecture="X", dtype="float16", num_hidden_layers=1, num_attention_heads=1)


def test_standin_load_is_as_strict_as_upstream(trtllm, store, tmp_path):
    from tensorrt_llm.models import MODEL_MAP
    from tensorrt_llm.models.modeling_utils import PretrainedConfig

    ckpt = _checkpoint(store, tmp_path, "LlamaForCausalLM")
    cfg = json.loads((ckpt / "config.json").read_text())
    model = MODEL_MAP["LlamaForCausalLM"](PretrainedConfig.from_dict({**cfg, "architecture": "LlamaForCausalLM"}))
    weights = {k: v for k, v in load_file(str(ckpt / "rank0.safetensors")).items() if not k.startswith("medusa")}
    missing = dict(weights)
    del missing["transformer.layers.1.mlp.gate.weight"]
    with pytest.raises(RuntimeError, match="Required but not provided tensors.*layers.1.mlp.gate.weight"):
        model.load(missing)
    wrong = dict(weights)
    wrong["transformer.layers.0.mlp.fc.weight"] = wrong["transformer.layers.0.mlp.fc.weight"].T
    with pytest.raises(RuntimeError, match="not the same shape"):
        model.load(wrong)
    trtllm.CALLS.clear()
    model.load({**weights, "transformer.layers.0.attention.dense.bias": torch.zeros(64)})
    assert any(c[0] == "warning" and "Provided but not required" in c[1] for c in trtllm.CALLS)


@pytest.mark.parametrize("arch", [a for a in NON_ALIBI_FAMILIES if not adapter_for(a).upstream_spec_decoding_plumbing])
def test_upstream_class_alone_cannot_take_spec_params(trtllm, store, tmp_path, arch):
    from tensorrt_llm.models import MODEL_MAP
    from tensorrt_llm.models.modeling_utils import PretrainedConfig

    cfg = json.loads((_checkpoint(store, tmp_path, arch) / "config.json").read_text())
    cfg["architecture"] = cfg["base_architecture"]  # the engine's name for the base (archs/base.py)
    model = MODEL_MAP[cfg["architecture"]](PretrainedConfig.from_dict(cfg))
    trtllm.CALLS.clear()
    try:
        model.forward(**model.prepare_inputs(max_draft_len=4))
    except TypeError as exc:  # the class has no such parameter: the build fails
        assert "spec_decoding_params" in str(exc)
    else:  # taken and dropped (OPT's forward(**kwargs)): attention without the tree mask, no error at all
        got = [c for c in trtllm.CALLS if c[0] == "attention"]
        assert got and all(c[2] is None for c in got), got


# -- the stand-in catches each bug it was rewritten for ------------------------------------------------
@pytest.mark.parametrize("arch", sorted({cls.hf_architectures[0] for cls in registry().values()
                                         if not cls.upstream_config_class}))
def test_catches_subclassing_a_config_class_upstream_does_not_have(trtllm, arch):
    from trtllm_medusa_ports.engine.registry import base_class

    with pytest.raises(AttributeError, match="config_class"):
        type("Old", (base_class(adapter_for(arch)).config_class,), {})


@pytest.mark.parametrize("arch, failure", [("GemmaForCausalLM", "TypeError"),
                                           ("Qwen3ForCausalLM", "no medusa_logits"),
                                           ("Starcoder2ForCausalLM", "no medusa_logits")])
def test_catches_the_old_route_through_model_map(trtllm, store, tmp_path, monkeypatch, arch, failure):
    """The old ``trtllm-medusa build``: register our class in MODEL_MAP under the checkpoint's
    name, with a config class that renames ``architecture`` to the base, then run ``trtllm-build``
    with patched argv. ``build_model`` looks the *renamed* architecture up again and builds the
    plain upstream class."""
    from tensorrt_llm.commands import build as build_mod
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.engine.registry import ported_classes

    ckpt = _checkpoint(store, tmp_path, arch)
    name = json.loads((ckpt / "config.json").read_text())["architecture"]
    monkeypatch.setitem(MODEL_MAP, name, ported_classes()[name])
    monkeypatch.setattr(sys, "argv", ["trtllm-build", "--checkpoint_dir", str(ckpt), "--output_dir",
                                      str(tmp_path / "eng"), "--speculative_decoding_mode", "medusa"])
    if failure == "TypeError":
        with pytest.raises(TypeError, match="spec_decoding_params"):
            build_mod.main()
    else:
        build_mod.main()
        engine = json.loads((tmp_path / "eng" / "rank0.engine").read_text())
        assert engine["model_class"] != name and "medusa_logits" not in engine["outputs"]
        assert any(c[0] == "warning" and "medusa_heads" in c[1] for c in trtllm.CALLS)


def test_catches_a_family_without_its_plumbing(trtllm, store, tmp_path, monkeypatch, capsys):
    from trtllm_medusa_ports.engine import medusa

    monkeypatch.setattr(medusa, "add_spec_decoding_plumbing", lambda transformer: transformer)
    assert _build(_checkpoint(store, tmp_path, "PhiForCausalLM"), tmp_path / "eng") == 1
    err = capsys.readouterr().err
    assert "spec_decoding_params" in err and "Traceback" not in err


def test_catches_a_tensor_name_the_engine_class_does_not_declare(trtllm, store, tmp_path, capsys):
    ckpt = _own_checkpoint(store, tmp_path, "GemmaForCausalLM")
    rank0 = load_file(str(ckpt / "rank0.safetensors"))
    rank0["transformer.layers.0.attention.dense.bias"] = torch.zeros(64, dtype=torch.float16)
    save_file(rank0, str(ckpt / "rank0.safetensors"))
    assert _build(ckpt, tmp_path / "eng") == 1
    err = capsys.readouterr().err
    assert "rank0.safetensors" in err and "transformer.layers.0.attention.dense.bias" in err
    assert "does not declare" in err


def test_catches_a_qwen_config_without_seq_length(trtllm, store, tmp_path, capsys):
    ckpt = _own_checkpoint(store, tmp_path, "Qwen2ForCausalLM")
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["seq_length"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert _build(ckpt, tmp_path / "eng") == 1
    assert "seq_length" in capsys.readouterr().err


def test_catches_upstream_medusa_at_pipeline_parallel(trtllm, store, tmp_path):
    """Upstream MedusaForCausalLm declares its heads on every rank; the checkpoint has them on the
    last stage: the converter names pp > 1 checkpoints for our class, whose heads live there."""
    ckpt = _own_checkpoint(store, tmp_path, "LlamaForCausalLM", pp=2)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architecture"] == "MedusaPortsLLaMAForCausalLM"
    cfg["architecture"] = "MedusaForCausalLM"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeError, match="Required but not provided tensors.*medusa_heads"):
        _engine_model(ckpt, rank=0)


def test_gpu_validation_gives_its_tiny_bases_a_tokenizer(tmp_path):
    """examples/run.py loads a tokenizer from --tokenizer_dir whatever the input; the GPU script
    saves one beside each tiny base, and it maps ids to text and back."""
    from transformers import AutoTokenizer

    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer

    script = (Path(__file__).parents[1] / "scripts" / "validate_on_gpu.sh").read_text()
    assert 'save_tiny_tokenizer(d / "tokenizer"' in script and '"--tokenizer_dir", f"{d}/tokenizer"' in script
    save_tiny_tokenizer(tmp_path, 251)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 251 and tok.eos_token_id == tok.pad_token_id == 0
    assert tok(tok.decode([3, 250, 17]))["input_ids"] == [3, 250, 17]


def test_build_warns_outside_the_checked_versions(trtllm, store, tmp_path, capsys, monkeypatch):
    ckpt = _checkpoint(store, tmp_path, "GemmaForCausalLM")
    assert _build(ckpt, tmp_path / "a") == 0 and "warning" not in capsys.readouterr().err
    monkeypatch.setattr(trtllm, "__version__", "0.15.0")
    assert _build(ckpt, tmp_path / "b") == 0
    assert "TensorRT-LLM 0.15.0 is outside >=1.2.0rc2,<1.3" in capsys.readouterr().err


# -- Granite: the multipliers reach the engine graph; fused paths that drop one are refused --------
def test_granite_multipliers_are_applied_in_the_engine_graph(trtllm, store, tmp_path, monkeypatch):
    import tensorrt_llm.builder as builder

    graphs = []
    reset = builder.reset_default_net

    def keep_outputs():
        graphs.append({name: t.name for name, (t, _) in builder.default_net().outputs.items()})
        reset()

    monkeypatch.setattr(builder, "default_net", __import__("tensorrt_llm.functional").functional.default_net,
                        raising=False)
    monkeypatch.setattr(builder, "reset_default_net", keep_outputs)
    ckpt = _checkpoint(store, tmp_path, "GraniteForCausalLM")
    cfg = json.loads((ckpt / "config.json").read_text())
    assert _build(ckpt, tmp_path / "eng") == 0
    logits = graphs[0]["logits"]
    # embedding * embedding_multiplier, each residual add scaled, logits * output_multiplier_scale
    assert f"*{cfg['embedding_multiplier']})" in logits
    scaled = f"(embedding(input_ids)*{cfg['embedding_multiplier']})"
    h1 = f"({scaled}+(attention(rmsnorm({scaled}))*{cfg['residual_multiplier']}))"  # layer 0, after attention
    mlp1 = f"(linear((silu(linear(rmsnorm({h1})))*linear(rmsnorm({h1}))))*{cfg['residual_multiplier']})"
    assert f"({h1}+{mlp1})" in logits
    assert logits.endswith(f"*{cfg['output_multiplier_scale']})")
    assert str(cfg["output_multiplier_scale"]) not in graphs[0]["medusa_logits"]  # heads' logits unscaled


@pytest.mark.parametrize("flag, tp, refused", [("--reduce_fusion", 2, "engine-fusion-multiplier"),
                                               ("--user_buffer", 2, "engine-fusion-multiplier"),
                                               # builder.build turns these off for tp 1 / outside NVFP4
                                               ("--reduce_fusion", 1, None), ("--norm_quant_fusion", 2, None),
                                               ("--pp_reduce_scatter", 1, "engine-build-flag")])
def test_fused_allreduce_flags_are_refused_where_they_drop_the_residual_multiplier(trtllm, store, tmp_path,
                                                                                   capsys, flag, tp, refused):
    granite = _checkpoint(store, tmp_path, "GraniteForCausalLM", name="granite", tp=tp)
    assert json.loads((granite / "config.json").read_text())["architecture"] == "MedusaForCausalLM"
    rc = _build(granite, tmp_path / "eng", flag, "enable")
    err = capsys.readouterr().err
    if refused is None:  # upstream's builder switches the flag off: the default path multiplies
        assert rc == 0, err
        return
    assert rc == 1 and f"[{refused}]" in err and flag in err
    if refused == "engine-fusion-multiplier":
        assert "residual_multiplier (0.22)" in err
    assert not (tmp_path / "eng").exists()
    llama = _checkpoint(store, tmp_path, "LlamaForCausalLM", name="llama", tp=tp)
    assert (_build(llama, tmp_path / "eng2", flag, "enable") == 0) == (refused != "engine-build-flag")


@pytest.mark.parametrize("flags, needle", [
    (["--gpt_attention_plugin", "disable"], "never reads spec_decoding_params"),
    (["--kv_cache_type", "disabled"], "computes no medusa_logits"),
    (["--tokens_per_block", "8"], "tokens per block"),
    (["--tokens_per_block", "256"], "tokens per block"),
    (["--max_beam_width", "2"], "no beam search"),
    (["--gather_all_token_logits"], "context logits cannot be gathered"),
    (["--gather_context_logits"], "context logits cannot be gathered"),
    (["--streamingllm", "enable"], "StreamingLLM"),
    (["--speculative_decoding_mode", "eagle"], "holds Medusa heads"),
    (["--multiple_profiles", "enable", "--opt_num_tokens", "64"], "refuses the pair"),
])
def test_build_flags_that_break_medusa_are_refused(trtllm, store, tmp_path, capsys, flags, needle):
    ckpt = _checkpoint(store, tmp_path, "Qwen2ForCausalLM")
    assert _build(ckpt, tmp_path / "eng", *flags) == 1
    err = capsys.readouterr().err
    assert "[engine-build-flag]" in err and flags[0] in err and needle in err, err
    assert not (tmp_path / "eng").exists() and not [c for c in trtllm.CALLS if c[0] == "build"]


def test_tokens_per_block_follows_the_xqa_route(trtllm, store, tmp_path, capsys):
    """16 tokens per block: JIT kernels take it (group size divides 64), precompiled ones do not."""
    jit = _checkpoint(store, tmp_path, "LlamaForCausalLM", name="jit")
    assert _build(jit, tmp_path / "e1", "--tokens_per_block", "16") == 0
    assert _build(jit, tmp_path / "e2", "--tokens_per_block", "64", "--fast_build", "--gather_generation_logits") == 0
    cfg = json.loads((tmp_path / "e2" / "config.json").read_text())["build_config"]
    assert cfg["plugin_config"]["tokens_per_block"] == 64 and cfg["plugin_config"]["manage_weights"] is True
    # the tiny Qwen2's group of 7 with head size 128: the precompiled kernels the runner picks take 32/64/128
    pre = _checkpoint(store, tmp_path, "Qwen2ForCausalLM", name="pre",
                      base=tiny_base(store, "Qwen2ForCausalLM", head_dim=128))
    assert _build(pre, tmp_path / "e3", "--tokens_per_block", "16") == 1
    err = capsys.readouterr().err
    assert "the precompiled XQA kernels the runner picks (group size 7 does not divide 64) take 32, 64, 128" in err
    assert not (tmp_path / "e3").exists()
    # head size 64: no precompiled cubin, so the kernels that run are the JIT ones TRTLLM_ENABLE_XQA_JIT=1
    # gives (the fix check names), which take 16
    assert _build(_checkpoint(store, tmp_path, "Qwen2ForCausalLM", name="h64"), tmp_path / "e4",
                  "--tokens_per_block", "16") == 0


@pytest.mark.parametrize("heads, kv, head, kv_algo, tokens, severity, needle", [
    (14, 2, 128, None, 16, "error", "precompiled XQA kernels the runner picks"),
    (14, 2, 128, None, 32, None, None),
    (14, 2, 64, None, 16, None, None),  # the JIT kernels of TRTLLM_ENABLE_XQA_JIT=1
    (14, 2, 64, None, 8, "error", "TRTLLM_ENABLE_XQA_JIT=1 gives"),
    (8, 2, 64, None, 8, "error", "group size 4 divides 64"),
    # an E4M3 cache: SM 9.0 picks JIT (QGMMA takes 8 and 16), SM 8.9 the precompiled kernels (32/64/128)
    (14, 2, 128, "FP8", 16, "warning", "on SM 8.9 with no kernel"),
    (14, 2, 64, "FP8", 8, "warning", "on SM 9.0 the JIT XQA kernels the runner picks"),
    (14, 2, 128, "FP8", 64, None, None),
    (14, 2, 128, "FP8", 256, "error", "take other tokens per block"),
    # group 64, head 128 (issue 57, m5): the runner picks JIT kernels that take at most 32; TRTLLM_ENABLE_XQA_JIT=0
    # gives the precompiled ones, which take 32/64/128
    (64, 1, 128, None, 16, "error", "the precompiled XQA kernels TRTLLM_ENABLE_XQA_JIT=0 gives"),
    (64, 1, 128, None, 64, None, None),
    (48, 1, 128, "FP8", 16, "error", "the precompiled XQA kernels TRTLLM_ENABLE_XQA_JIT=0 gives"),
])
def test_tokens_per_block_per_gpu(heads, kv, head, kv_algo, tokens, severity, needle):
    from trtllm_medusa_ports.engine.build import flag_findings

    cfg = {"num_attention_heads": heads, "num_key_value_heads": kv, "head_size": head, "num_medusa_heads": 2,
           "quantization": {"kv_cache_quant_algo": kv_algo}}
    found = [f for f in flag_findings(cfg, SimpleNamespace(tokens_per_block=tokens)) if "tokens_per_block" in f.message]
    if severity is None:
        assert not found, found
    else:
        assert len(found) == 1 and found[0].severity == severity and needle in found[0].message, found


def test_one_family_failing_to_build_its_class_does_not_block_the_others(trtllm, store, tmp_path, monkeypatch,
                                                                        capsys):
    import tensorrt_llm.models.phi.model as phi

    monkeypatch.delattr(phi, "PhiForCausalLM")  # as if upstream had renamed it
    assert _build(_checkpoint(store, tmp_path, "Qwen2ForCausalLM", name="q"), tmp_path / "e1") == 0
    assert _build(_checkpoint(store, tmp_path, "PhiForCausalLM", name="p"), tmp_path / "e2") == 1
    err = capsys.readouterr().err
    assert "engine class for MedusaPortsPhiForCausalLM could not be built" in err and "PhiForCausalLM" in err


# -- quantized checkpoints through upstream's quantized load path (stand-in: quantization/, preprocess_weights) --
_WIDE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _calibration(vocab: int) -> Path:
    """Four 8-token calibration samples for a vocabulary, written once per test run (read-only)."""
    def write(d):
        d.mkdir()
        (d / "calib.jsonl").write_text("\n".join(json.dumps({"input_ids": [(5 * i + j) % vocab for i in range(8)]})
                                                 for j in range(4)))
    return built_once(run_store() / f"engine-calib-{vocab}", write) / "calib.jsonl"


def _quantized(store, tmp_path, arch, tp, name="q", own=False, **flags):
    """A wide tiny base quantized with ``flags`` (shared read-only, or with ``own`` the test's copy to change)."""
    base = tiny_base(store, arch, **_WIDE)
    calib = _calibration(HFConfig.read(base).get("vocab_size"))
    return (_own_checkpoint if own else _checkpoint)(store, tmp_path, arch, tp=tp, name=name, base=base,
                                                     calib_dataset=calib, calib_size=4, **flags)


@pytest.mark.parametrize("arch, tp, flags", [
    ("LlamaForCausalLM", 2, dict(qformat="fp8", kv_cache_dtype="fp8")),
    ("LlamaForCausalLM", 1, dict(use_weight_only=True, weight_only_precision="int4", int8_kv_cache=True)),
    ("GemmaForCausalLM", 2, dict(qformat="int8_wo")),
    ("Phi3ForCausalLM", 1, dict(qformat="fp8")),
])
def test_quantized_checkpoints_load_through_upstreams_quantized_path(trtllm, store, tmp_path, arch, tp, flags):
    ckpt = _quantized(store, tmp_path, arch, tp, **flags)
    assert _build(ckpt, tmp_path / "eng") == 0
    model = _engine_model(ckpt, rank=tp - 1)
    params = dict(model.named_parameters())
    algo = json.loads((ckpt / "config.json").read_text())["quantization"]["quant_algo"]
    qkv = params["transformer.layers.0.attention.qkv.weight"].value
    if algo == "FP8":
        assert qkv.dtype == torch.float8_e4m3fn
        assert params["transformer.layers.0.mlp.proj.activation_scaling_factor"].value.shape == (1,)
    else:  # quantized at load by preprocess_weights, transposed [in, out * bits / 8]
        assert qkv.dtype == torch.int8 and qkv.shape[0] == 128
        assert "transformer.layers.0.attention.dense.per_channel_scale" in params
    heads = [n for n in params if n.startswith("medusa_heads") or n.startswith("lm_head")]
    assert heads and all(params[n].value.dtype == torch.float16 for n in heads)  # heads stay float
    if flags.get("kv_cache_dtype") or flags.get("int8_kv_cache"):
        assert params["transformer.layers.0.attention.kv_cache_rcp_scaling_factor"].value.shape == (1,)


@pytest.mark.parametrize("damage, needle", [
    # exclude_modules without *medusa_heads*: the heads become weight-only layers, which the load-time quantizer
    # (tensor-name rule) never feeds
    ("quantize-heads", "medusa_layers.0.linear.per_channel_scale"),
    ("drop-scale", "Required but not provided"),
    ("rename-scale", "Required but not provided"),
    ("scale-shape", "not the same shape"),
    ("weight-not-fp8", "the parameter is fp8"),
])
def test_standin_catches_a_damaged_quantized_checkpoint(trtllm, store, tmp_path, capsys, monkeypatch, damage,
                                                         needle):
    flags = dict(qformat="int8_wo") if damage == "quantize-heads" else dict(qformat="fp8")
    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, own=True, **flags)
    cfg = json.loads((ckpt / "config.json").read_text())
    name = "transformer.layers.0.mlp.fc.activation_scaling_factor"
    if damage == "quantize-heads":
        cfg["quantization"]["exclude_modules"] = [p for p in cfg["quantization"]["exclude_modules"]
                                                  if "medusa" not in p]
        (ckpt / "config.json").write_text(json.dumps(cfg))
    else:
        t = load_file(str(ckpt / "rank0.safetensors"))
        v = t.pop(name)
        if damage == "rename-scale":
            t[name.replace("activation_", "act_")] = v
        elif damage == "scale-shape":
            t[name] = torch.cat([v, v])
        elif damage == "weight-not-fp8":
            t[name] = v
            w = "transformer.layers.0.attention.qkv.weight"
            t[w] = t[w].to(torch.float16)
        save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    assert _build(ckpt, tmp_path / "eng") == 1
    err = capsys.readouterr().err
    ours = OUR_REFUSAL[damage]  # refused by our checkpoint validation before TensorRT-LLM is reached
    assert (ours or needle) in err, err
    if ours is not None:  # and the stand-in itself catches it, as TensorRT-LLM's load would
        import trtllm_medusa_ports.engine.build as build_mod
        from trtllm_medusa_ports.files.jsonfile import read_json

        monkeypatch.setattr(build_mod, "read_checkpoint_config", lambda d: read_json(d / "config.json", ValueError, fix=""))
        assert _build(ckpt, tmp_path / "eng2") == 1
        err = capsys.readouterr().err
        assert needle in err and ours not in err, err


#: what our validation (files/checkpoint.py check_medusa_excluded, quant quantized_layer_problems, quant/engine_load.py
#: load_problems) says first
OUR_REFUSAL = {"quantize-heads": "would be built as a quantized layer", "drop-scale": "without activation_scaling_factor",
               "rename-scale": "without activation_scaling_factor",
               "scale-shape": "activation_scaling_factor is float32 [2], but FP8Linear (tensorrt_llm/quantization/"
                              "layers.py) declares it float32 [1]",
               "weight-not-fp8": "qkv.weight is float16"}


def test_float16_checkpoint_of_an_overflowing_base_carries_the_finding_and_build_refuses_it(trtllm, store, tmp_path,
                                                                                           capsys):
    ckpt = _checkpoint(store, tmp_path, "Gemma3ForCausalLM", dtype="float16")
    warnings = json.loads((ckpt / "config.json").read_text())["medusa_ports"]["warnings"]
    assert any(w.startswith("[float16-range]") for w in warnings)
    assert _build(ckpt, tmp_path / "eng") == 1
    err = capsys.readouterr().err
    assert "[float16-range]" in err and "--dtype bfloat16" in err and not (tmp_path / "eng").exists()
    assert _build(ckpt, tmp_path / "eng", "--allow_unsupported") == 0
    bf16 = _checkpoint(store, tmp_path, "Gemma3ForCausalLM", name="bf16", dtype="bfloat16")
    assert not [w for w in json.loads((bf16 / "config.json").read_text())["medusa_ports"]["warnings"]
                if w.startswith("[float16-range]")]
    assert _build(bf16, tmp_path / "eng2") == 0


def test_standin_derives_max_seq_len_and_kv_cache_type_as_upstreams_builder(trtllm, store, tmp_path):
    """builder.py: max_seq_len = max_position_embeddings x ceil(linear factor) + max_draft_len (Medusa);
    --paged_kv_cache disable means a continuous cache; reduce_fusion dropped at tp 1."""
    base = tiny_base(store, "LlamaForCausalLM", rope_scaling={"rope_type": "linear", "factor": 2.0})
    ckpt = _checkpoint(store, tmp_path, "LlamaForCausalLM", base=base, max_draft_len=7)
    assert _build(ckpt, tmp_path / "eng", "--paged_kv_cache", "disable", "--reduce_fusion", "enable") == 0
    cfg = json.loads((tmp_path / "eng" / "config.json").read_text())
    max_pos = cfg["pretrained_config"]["max_position_embeddings"]
    assert cfg["build_config"]["max_seq_len"] == max_pos * 2 + 7
    assert cfg["build_config"]["kv_cache_type"] == "continuous"
    assert cfg["build_config"]["plugin_config"]["reduce_fusion"] is False


def test_an_expert_parallel_checkpoint_loads_into_the_moe_layer_on_every_rank(trtllm, store, tmp_path):
    """moe_ep_size 2 at tp 2: the engine's MOE layer (stand-in of tensorrt_llm/layers/moe.py) declares
    experts / 2 whole experts per rank and loads the checkpoint's shapes (a mismatch raises in load)."""
    ckpt = _checkpoint(store, tmp_path, "MixtralForCausalLM", tp=2, moe_ep_size=2)
    experts = json.loads((ckpt / "config.json").read_text())["moe"]["num_experts"]
    for rank in (0, 1):
        model = _engine_model(ckpt, rank)
        mlp = next(iter(model.transformer.layers)).mlp
        assert mlp.fc.weight.shape[0] == experts // 2 and mlp.fc.weight.is_inited()
        assert model.config.mapping.moe_ep_size == 2 and model.config.mapping.moe_tp_size == 1
        # set_rank moves only the rank (PretrainedConfig.set_rank: self.mapping.rank = rank); the ranks follow it
        assert (model.config.mapping.moe_ep_rank, model.config.mapping.moe_tp_rank) == (rank, 0)


def test_moe_plugin_disable_is_refused_for_a_shared_expert_and_warned_otherwise(trtllm, store, tmp_path, capsys):
    """--moe_plugin disable swaps every MOE layer for MoeOOTB (to_ootb_moe); a SharedMoE cannot be swapped
    (MoeOOTB takes no use_shared_gate): refused before the build, which the stand-in shows would raise."""
    shared = _checkpoint(store, tmp_path, "Qwen2MoeForCausalLM", name="shared")
    assert _build(shared, tmp_path / "e1", "--moe_plugin", "disable") == 1
    err = capsys.readouterr().err
    assert "error: [engine-build-flag] --moe_plugin disable: this base has a shared expert" in err, err
    assert "use_shared_gate" in err and "leave --moe_plugin at auto" in err
    assert not (tmp_path / "e1").exists() and not [c for c in trtllm.CALLS if c[0] == "build"]
    from tensorrt_llm.models.modeling_utils import to_ootb_moe

    with pytest.raises(TypeError, match="use_shared_gate"):  # what the refusal saves the user from
        to_ootb_moe(_engine_model(shared))

    assert _build(shared, tmp_path / "e2") == 0  # the plugin (default auto) takes it
    assert not [c for c in trtllm.CALLS if c[0] == "ootb_moe"]
    routed = _checkpoint(store, tmp_path, "MixtralForCausalLM", name="routed")
    assert _build(routed, tmp_path / "e3", "--moe_plugin", "disable") == 0
    err = capsys.readouterr().err
    assert "warning: [engine-build-flag] --moe_plugin disable builds the plugin-free MoE" in err, err
    layers = json.loads((routed / "config.json").read_text())["num_hidden_layers"]
    assert len([c for c in trtllm.CALLS if c[0] == "ootb_moe"]) == layers
    dense = _checkpoint(store, tmp_path, "LlamaForCausalLM", name="dense")
    assert _build(dense, tmp_path / "e4", "--moe_plugin", "disable") == 0
    assert "moe_plugin" not in capsys.readouterr().err


@pytest.mark.parametrize("arch, extra", [
    ("Qwen2MoeForCausalLM", dict(moe_intermediate_size=64, shared_expert_intermediate_size=128)),
    ("GraniteMoeForCausalLM", dict(intermediate_size=96)),  # one fused 3-D source per layer
])
def test_weight_only_experts_load_into_the_quantized_moe_layer(trtllm, store, tmp_path, capsys, arch, extra):
    """A weight-only MoE checkpoint (float experts) through upstream's load: weight_only_quantize_dict (stand-in of
    tensorrt_llm/models/convert_utils.py) quantizes the 3-D experts per expert into what the quantized MOE declares
    (int8 [experts, in, out * bits / 8], per_channel_scale [experts, out]); the router and the shared expert's gate
    stay float - the gate only because the written exclude_modules names its tensor."""
    base = tiny_base(store, arch, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, **extra)
    ckpt = _own_checkpoint(store, tmp_path, arch, tp=2, base=base, qformat="int4_wo")  # changed below
    cfg = json.loads((ckpt / "config.json").read_text())
    experts, hidden = cfg["moe"]["num_experts"], cfg["hidden_size"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    for rank in (0, 1):
        mlp = next(iter(_engine_model(ckpt, rank).transformer.layers)).mlp
        assert mlp.fc.weight.dtype == "int8" and mlp.fc.weight.is_inited()
        local = inter // 2  # each expert's intermediate size on one of the two ranks
        assert mlp.fc.weight.shape == (experts, hidden, 2 * local * 4 // 8)  # [E, in, out * bits / 8]
        assert mlp.fc.per_channel_scale.shape == (experts, 2 * local) and mlp.fc.per_channel_scale.is_inited()
        assert mlp.proj.weight.shape == (experts, local, hidden * 4 // 8)
        assert mlp.router.weight.dtype == "float32" and mlp.router.weight.is_inited()
        if "shared_expert_gate" in mlp._modules:
            assert mlp.shared_expert_gate.weight.dtype == "float16"
    assert _build(ckpt, tmp_path / "eng") == 0
    assert _build(ckpt, tmp_path / "e2", "--moe_plugin", "disable") == 1
    assert "does not support weight only quantization" in capsys.readouterr().err
    assert not (tmp_path / "e2").exists()
    if arch == "Qwen2MoeForCausalLM":  # the pattern the load-time quantizer needs, shown by taking it away
        cfg["quantization"]["exclude_modules"].remove("*shared_expert_gate.weight")
        (ckpt / "config.json").write_text(json.dumps(cfg))
        assert _build(ckpt, tmp_path / "e3") == 1
        assert "shared_expert_gate" in capsys.readouterr().err


def test_the_standin_moe_config_writes_itself_as_upstreams_configs_do(trtllm):
    """Issue 66: upstream's MoeConfig has to_dict (asdict) and its nested normalization-mode enum, which DBRX's config
    calls; every config with experts writes ``moe`` as a dict (tensorrt_llm/layers/moe.py,
    tensorrt_llm/models/{llama,qwen,dbrx}/config.py)."""
    from tensorrt_llm.layers import MoeConfig
    from tensorrt_llm.models import MODEL_MAP

    mode = MoeConfig.ExpertScaleNormalizationMode
    assert (int(mode.NONE), int(mode.RENORMALIZE), int(mode.DEVICE_LIMITED_RENORM)) == (0, 1, 4)
    assert MoeConfig().normalization_mode == mode.RENORMALIZE
    d = MoeConfig(num_experts=4, top_k=2).to_dict()
    assert d["num_experts"] == 4 and len(d) == 9 and MoeConfig.from_dict(d) == MoeConfig(num_experts=4, top_k=2)
    base = dict(dtype="float16", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
    dbrx = MODEL_MAP["DbrxForCausalLM"].config_class
    legacy = dbrx(architecture="DbrxForCausalLM", moe_num_experts=4, moe_top_k=2, **base)  # the legacy keys
    assert legacy.moe == MoeConfig(num_experts=4, top_k=2) and legacy.rotary_base == 500000.0
    written = legacy.to_dict()
    assert written["moe"] == d and written["clip_qkv"] is None and written["bias"] is False
    assert dbrx(architecture="DbrxForCausalLM", moe=d, **base).moe == legacy.moe
    with pytest.raises(ValueError, match="Both or neither"):
        dbrx(architecture="DbrxForCausalLM", moe={"num_experts": 4}, **base)
    for arch in ("MixtralForCausalLM", "Qwen2MoeForCausalLM"):
        cfg = MODEL_MAP[arch].config_class(architecture=arch, moe=d, **base)
        assert cfg.to_dict()["moe"] == d, arch
