"""Every supported family: convert (its default shape at tp 1 and 2, every shape at tp 2), verify parity, greedy
equivalence and the tree proof, checker verdict."""

import json
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_proven,
    assert_tree_step_matches_sequential,
    convert_to,
    family_checkpoint,
    heads_once,
    tiny_base,
    verified_once,
)

from trtllm_medusa_ports.archs import adapter_for, registry, supported_architectures
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.archs.weights import Role
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.compat import check
from trtllm_medusa_ports.errors import ConversionError, ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig, assign
from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS
from trtllm_medusa_ports.reference import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree
from trtllm_medusa_ports.verify import verify

#: verify OK must mean the engine builds: each checkpoint proven here is built on the stand-in (conftest.py)
pytestmark = [pytest.mark.numerics]

TREE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"
ALIBI = {cls.hf_architectures[0] for cls in registry().values() if cls.position_embedding is PositionEmbedding.ALIBI}

#: (architecture, overrides): the shapes each family declares (ArchAdapter.test_variants)
CASES = family_test_cases()
VARIANTS = CASES["variants"]


#: the in-memory verify runs of the run's shared checkpoints (conftest.family_checkpoint, verified_once), each
#: computed once per run: FULL (greedy equivalence over 12 tokens) for the family-wide test and those whose
#: assertions read the prompts' logits only; SHORT, test_verify_streaming's in-memory run, for the intact
#: checkpoints the damaging tests start from
FULL = dict(medusa_choices=TREE, max_new_tokens=12, streaming=False)
SHORT = dict(medusa_choices=TREE, max_new_tokens=4, streaming=False)


def _copy(ckpt: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(ckpt, tmp_path / "c")
    return tmp_path / "c"


#: each family's first (default) shape is proven at tp 1 and 2; its other shapes (head counts, biases, ties, rotary
#: fractions, expert counts) at tp 2, which shards what they change and runs every step tp 1 runs, on two ranks
TP_SIZES = [(1, 2) if all(a != arch for a, _ in VARIANTS[:i]) else (2,) for i, (arch, _) in enumerate(VARIANTS)]


def test_every_family_has_its_default_shape_at_tp_1_and_every_shape_at_tp_2():
    assert {arch for (arch, _), tps in zip(VARIANTS, TP_SIZES) if 1 in tps} == {arch for arch, _ in VARIANTS}
    assert all(2 in tps for tps in TP_SIZES) and sum(1 in tps for tps in TP_SIZES) == len({a for a, _ in VARIANTS})
    assert all(o == {} for (_, o), tps in zip(VARIANTS, TP_SIZES) if 1 in tps)


@pytest.mark.parametrize("arch, overrides, tp_sizes", [(a, o, t) for (a, o), t in zip(VARIANTS, TP_SIZES)],
                         ids=[f"{a}-{i}" for i, (a, _) in enumerate(VARIANTS)])
def test_family_converts_and_verifies(arch, overrides, tp_sizes):
    for tp in tp_sizes:  # allow_unsupported where the family's check refuses it (CASES["unsupported"])
        base, ckpt = family_checkpoint(arch, tp, **overrides)
        cfg = json.loads((ckpt / "config.json").read_text())
        assert cfg["base_architecture"] == adapter_for(arch).base_architecture(arch)
        assert_proven(verified_once(base, ckpt, **FULL), f"tp={tp}")


def test_gptj_mlp_bias_is_added_once_across_ranks(tmp_path, store):
    """GPT-J's layer all-reduces attention + MLP once and every rank adds its fc_out bias: rank 0 holds it,
    the others zeros (tensorrt_llm/models/gptj/convert.py). The same bias on every rank counts it twice."""
    from safetensors.torch import load_file, save_file

    base, intact = family_checkpoint("GPTJForCausalLM", 2)
    hf = load_file(base / "model.safetensors")
    name = "transformer.layers.1.mlp.proj.bias"
    ranks = [load_file(intact / f"rank{r}.safetensors") for r in (0, 1)]
    assert torch.equal(ranks[0][name], hf["transformer.h.1.mlp.fc_out.bias"]) and not ranks[1][name].any()
    assert verified_once(base, intact, **SHORT).parity
    ckpt = _copy(intact, tmp_path)
    ranks[1][name] = ranks[0][name].clone()  # replicated as other families' row biases are
    save_file(ranks[1], ckpt / "rank1.safetensors", metadata={"format": "pt"})
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert not rep.parity and "layers.1" in rep.render()


def test_every_family_declares_its_own_hf_defaults_and_they_are_transformers():
    """A family reads config.json with its Hugging Face config class's defaults, never Llama's: each class
    declares its own (a subclass inheriting its parent's would read Llama's epsilon for a LayerNorm family)."""
    import transformers

    from trtllm_medusa_ports.archs.registry import own

    checked = 0
    for cls in dict.fromkeys(registry().values()):
        tiny = own(cls, "tiny_config")
        if tiny is None:
            continue
        defaults = own(cls, "hf_defaults")
        assert defaults, f"{cls.__name__} declares no hf_defaults of its own"
        assert {"tie_word_embeddings", cls.norm_epsilon_key or "tie_word_embeddings"} <= set(defaults), cls.__name__
        hf = transformers.AutoConfig.for_model(tiny["model_type"])
        for key, value in defaults.items():
            theirs = hf
            for part in key.split("."):  # a path into a nested config (DBRX's attn_config.rope_theta)
                theirs = theirs.get(part) if isinstance(theirs, dict) else getattr(theirs, part, None)
            if theirs is not None:
                assert theirs == value, f"{cls.__name__}: hf_defaults[{key!r}] = {value!r}, transformers has {theirs!r}"
                checked += 1
        # the RoPE fraction (transformers 5 keeps it in rope_parameters): a config class whose default is not 1
        # needs it declared, or a config.json leaving it out would be read as a whole-head rotation
        params = getattr(hf, "rope_parameters", None)
        theirs = params.get("partial_rotary_factor") if isinstance(params, dict) else getattr(
            hf, "partial_rotary_factor", None)
        if theirs is not None:
            assert defaults.get("partial_rotary_factor", 1.0) == theirs, f"{cls.__name__}: RoPE fraction default"
    assert checked >= 40


@pytest.mark.parametrize("arch, want", [("GPTNeoXForCausalLM", 0.25), ("PhiForCausalLM", 0.5),
                                        ("NemotronForCausalLM", 0.5), ("Phi3ForCausalLM", 1.0)])
def test_a_rope_fraction_left_out_of_config_json_is_the_familys_default(tmp_path, arch, want):
    """save_pretrained may leave out a value equal to its config class's default: GPT-NeoX's rotary_pct 0.25 must
    not be read as a whole-head rotation."""
    cls = registry()[arch]
    data = {k: v for k, v in cls.tiny_config.items() if k not in ("rotary_pct", "partial_rotary_factor")}
    hf = HFConfig(dict(data, architectures=[arch]), tmp_path / "config.json")
    assert cls().rotary_fraction(hf) == want
    assert cls().engine_config(hf)["rotary_pct"] == want
    nested = HFConfig(dict(data, architectures=[arch], rope_parameters={"partial_rotary_factor": 0.125}),
                      tmp_path / "config.json")
    assert cls().rotary_fraction(nested) == 0.125  # transformers 5's place for it


def test_a_family_value_read_without_a_default_fails_loudly(tmp_path):
    from trtllm_medusa_ports.archs.llama import LlamaAdapter

    class NoDefaults(LlamaAdapter):
        hf_architectures = ("NoDefaultsForCausalLM",)
        hf_defaults = {}

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoDefaultsForCausalLM"]}))
    hf = HFConfig.read(tmp_path)
    with pytest.raises(AssertionError, match="reads 'tie_word_embeddings' with no default of its own"):
        NoDefaults().tied_embeddings(hf)
    assert LlamaAdapter().tied_embeddings(hf) is False and adapter_for("CohereForCausalLM").tied_embeddings(hf) is True


@pytest.mark.parametrize("damage", ["expert order", "up and gate halves", "normalization mode", "top k"])
def test_a_wrong_expert_layout_or_routing_fails_verify(tmp_path, store, damage):
    """Each way an MoE port goes wrong silently: experts swapped, an expert's [up; gate] halves transposed, the
    routing's normalisation or its top-k other than the base's."""
    from safetensors.torch import load_file, save_file

    base, intact = family_checkpoint("MixtralForCausalLM", 2)
    good = verified_once(base, intact, **SHORT)
    assert good.parity
    # the tree's cost on a MoE base: a step of 7 tokens wakes more of the 4 experts than a token's top-2
    assert good.moe_num_experts == 4 and good.moe_experts_per_plain_step == 2
    assert 2 <= good.moe_experts_per_tree_step <= 4 and "experts           : a tree step of 7 tokens" in good.render()
    ckpt = _copy(intact, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    if damage in ("normalization mode", "top k"):
        if damage == "normalization mode":
            cfg["moe"]["normalization_mode"] = 0  # NONE: the softmax over all experts, not renormalised
        else:
            cfg["moe"]["top_k"] = 1
        (ckpt / "config.json").write_text(json.dumps(cfg))
    else:
        for r in (0, 1):
            path = ckpt / f"rank{r}.safetensors"
            w = load_file(path)
            fc = w["transformer.layers.0.mlp.fc.weight"]
            if damage == "expert order":
                fc = fc[[1, 0, *range(2, fc.shape[0])]]
            else:
                half = fc.shape[1] // 2
                fc = torch.cat([fc[:, half:], fc[:, :half]], dim=1)
            w["transformer.layers.0.mlp.fc.weight"] = fc.contiguous()
            save_file(w, path, metadata={"format": "pt"})
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert not rep.parity, damage


def test_a_missing_or_ungated_shared_expert_fails(tmp_path, store):
    """Qwen2-MoE's shared expert counts: without it, or without its sigmoid gate, the checkpoint is another model."""
    from safetensors.torch import load_file, save_file

    base, intact = family_checkpoint("Qwen2MoeForCausalLM", 2)
    good = verified_once(base, intact, **SHORT)
    assert good.parity and good.greedy_equal and good.moe_experts_per_plain_step == 2
    ckpt = _copy(intact, tmp_path)
    for r in (0, 1):  # the gate at zero: sigmoid(0) = 0.5 instead of the base's
        path = ckpt / f"rank{r}.safetensors"
        w = load_file(path)
        w["transformer.layers.1.mlp.shared_expert_gate.weight"] = torch.zeros_like(
            w["transformer.layers.1.mlp.shared_expert_gate.weight"])
        save_file(w, path, metadata={"format": "pt"})
    assert not verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4).parity
    w = load_file(ckpt / "rank1.safetensors")
    del w["transformer.layers.0.mlp.shared_expert.fc.weight"]
    save_file(w, ckpt / "rank1.safetensors", metadata={"format": "pt"})
    with pytest.raises(Exception, match="shared_expert.fc"):
        verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"])
def test_renormalised_qwen_moe_routing_is_written_as_renormalize(tmp_path, store, arch):
    """``norm_topk_prob: true`` (every released Qwen3-MoE) is TensorRT-LLM's RENORMALIZE: QWenConfig reads the
    checkpoint's moe block as written (tensorrt_llm/models/qwen/config.py), so the port writes mode 1, checks
    clean, and verifies at tp 2 with expert parallelism; the same checkpoint with upstream's converter's NONE
    is another model and fails parity."""
    base = tiny_base(store, arch, norm_topk_prob=True)
    heads = heads_once(base)
    _, findings = check(base, heads)
    assert [f.rule for f in findings if f.severity == "error"] == []
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=2, moe_ep_size=2)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["moe"]["normalization_mode"] == 1 and cfg["moe"]["top_k"] == 2
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert_proven(rep)
    _, plain = family_checkpoint(arch, 1, norm_topk_prob=False)
    assert json.loads((plain / "config.json").read_text())["moe"]["normalization_mode"] == 0
    cfg["moe"]["normalization_mode"] = 0
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert not verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4).parity


def test_every_registered_family_has_a_tiny_config_and_its_test_data():
    primary = {cls.hf_architectures[0] for cls in registry().values()}
    assert primary <= set(TINY_CONFIGS)
    aliases = set(supported_architectures()) - primary
    assert aliases <= {a for a, _, _ in CASES["key_cases"]}  # an alias reaches the engine class as its family does
    # every family is verified in some shape: its own variants, or (Llama, Mistral, Qwen2) the tests built on them
    assert {a for a, _ in VARIANTS} | {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"} >= primary


@pytest.mark.parametrize("arch", sorted(ALIBI))
def test_alibi_families_are_refused_without_override(tmp_path, store, arch):
    base = tiny_base(store, arch)
    heads = heads_once(base)
    _, findings = check(base, heads)
    assert [f.rule for f in findings if f.severity == "error"] == ["alibi-position-embedding"]
    with pytest.raises(ConversionError, match="alibi-position-embedding"):
        convert_to(tmp_path / "c", base, heads)
    assert not (tmp_path / "c").exists()
    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert

    res = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "c",
                                 quiet=True, allow_unsupported=True))
    assert any("CANNOT SERVE" in w for w in res.warnings)
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    assert cfg["position_embedding_type"] == "alibi"
    assert cfg["architecture"].startswith("MedusaPorts")


@pytest.mark.parametrize("arch, verdict", CASES["verdicts"])
def test_checker_verdict_per_family(store, tmp_path, arch, verdict):
    base = tiny_base(store, arch)
    _, findings = check(base, heads_once(base))
    assert {f.rule for f in findings if f.severity == "error"} == verdict
    ad = adapter_for(arch)
    infos = {f.rule for f in findings}
    assert ("spec-decoding-plumbing" in infos) == (not ad.upstream_spec_decoding_plumbing)


@pytest.mark.parametrize("arch, overrides, rule", CASES["check_cases"],
                         ids=[f"{a}-{'-'.join(o)}" for a, o, _ in CASES["check_cases"]])
def test_each_declared_limit_is_an_error_check_gives(store, arch, overrides, rule):
    """The limits a family declares (``check_cases``): its tiny model with each change gets that error from
    ``check``, and the tiny model itself does not."""
    base = tiny_base(store, arch, **overrides)
    _, findings = check(base, heads_once(base))
    named = [f for f in findings if f.severity == "error" and f.rule == rule
             and any(k.split(".")[-1] in f.message for k in overrides)]  # for the key changed, not another
    assert named, (overrides, [(f.rule, f.message) for f in findings])
    assert rule not in dict(CASES["verdicts"])[arch]


def test_families_declare_their_limits_as_check_cases():
    assert {a for a, _, _ in CASES["check_cases"]} >= {"PhiForCausalLM", "GPTNeoXForCausalLM", "PhimoeForCausalLM"}


@pytest.mark.parametrize("arch", ["GPTNeoXForCausalLM", "FalconForCausalLM", "MptForCausalLM"])
def test_exact_gelu_bases_are_compared_with_engine_arithmetic(arch):
    base, ckpt = family_checkpoint(arch, 1)  # allow_unsupported for MPT's ALiBi
    _, findings = check(base, heads_once(base))
    assert "gelu-approximation" in {f.rule for f in findings}
    rep = verified_once(base, ckpt, **FULL)  # the adjustment and its effect are measured on the prompts' logits
    assert rep.adjustments and "tanh" in rep.adjustments[0]
    assert rep.engine_arithmetic_effect_max_abs_diff > rep.logits_max_abs_diff


@pytest.mark.parametrize("arch", ["BloomForCausalLM", "MptForCausalLM", "Gemma3ForCausalLM", "PhiForCausalLM"])
def test_tree_step_equals_sequential_decoding(arch):
    """Tree attention with positions past + depth (ALiBi bias from depth, not slot index)."""
    _, ckpt = family_checkpoint(arch, 2)  # allow_unsupported for the ALiBi families
    ref = ReferenceModel(ckpt)
    tree = MedusaTree.from_spec(TREE)
    prompt = [5, 9, 200, 31]
    tokens = torch.tensor([17, 3, 4, 250, 8, 9, 10])
    logits = assert_tree_step_matches_sequential(ref, prompt, tokens, tree)
    if arch in ALIBI:  # slot-index positions would give other logits for deeper nodes
        wrong, _ = ref.forward(tokens, _prefilled(ref, prompt),
                               spec_decoding_position_offsets=list(range(tree.num_tokens)),
                               spec_decoding_packed_mask=tree.packed_mask)
        assert not torch.allclose(wrong[2], logits[2], atol=1e-4)


def _prefilled(ref, prompt):
    cache = ref.new_cache()
    ref.forward(prompt, cache)
    return cache


@pytest.mark.parametrize("document, kind", [("README.md", "readme"), ("docs/porting-guide.md", "guide")])
def test_family_tables_are_the_ones_the_adapters_render(document, kind):
    from pathlib import Path

    from trtllm_medusa_ports import families

    path = Path(__file__).resolve().parents[1] / document
    assert path.read_text() == families.rendered_document(path, kind), (
        f"{document}'s family table differs from the adapters: run python -m trtllm_medusa_ports.families --write")
    for arch in supported_architectures():
        assert f"`{arch}`" in families.render(kind), arch


@pytest.mark.parametrize("document", ["docs/engine.md", "docs/compatibility-rules.md", "docs/porting-guide.md"])
def test_family_lists_in_the_docs_are_derived_from_the_adapters(document, monkeypatch):
    from pathlib import Path

    from trtllm_medusa_ports import families
    from trtllm_medusa_ports.archs.phi import PhiAdapter

    path = Path(__file__).resolve().parents[1] / document
    text = path.read_text()
    assert "<!-- families:" in text
    assert families.rendered_lists(text) == text, f"{document}: run python -m trtllm_medusa_ports.families --write"
    if "no-pipeline-parallel" in text:  # a family that gained pipeline parallelism leaves the list by itself
        assert "`PhiForCausalLM`" in families.LISTS["no-pipeline-parallel"]()
        monkeypatch.setattr(PhiAdapter, "engine_pipeline_parallel", True)
        assert "`PhiForCausalLM`" not in families.LISTS["no-pipeline-parallel"]()


def test_every_class_with_engine_limits_states_them_for_the_docs():
    """docs/compatibility-rules.md lists each family's engine limits from the adapters: a class that adds
    limits of its own must say what they are (engine_limits_summary), or the list would miss it."""
    for cls in dict.fromkeys(registry().values()):
        if "engine_limits" in cls.__dict__:
            assert cls.__dict__.get("engine_limits_summary"), f"{cls.__name__} declares no engine_limits_summary"


def test_family_table_refuses_a_class_that_inherits_its_parents_row():
    from trtllm_medusa_ports import families
    from trtllm_medusa_ports.archs.llama import LlamaAdapter

    class Copycat(LlamaAdapter):
        hf_architectures = ("CopycatForCausalLM",)

    assert families._row_problems(LlamaAdapter) == []
    assert "Copycat declares no medusa_status of its own" in "; ".join(families._row_problems(Copycat))


def test_gemma_embedding_is_split_as_gemmaconfig_imposes(store, tmp_path):
    from safetensors.torch import load_file

    base, ckpt = family_checkpoint("GemmaForCausalLM", 2)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["use_parallel_embedding"] is True and cfg["embedding_sharding_dim"] == 0
    assert any("use_parallel_embedding=True" in w for w in cfg["medusa_ports"]["warnings"])
    assert load_file(str(ckpt / "rank1.safetensors"))["transformer.vocab_embedding.weight"].shape[0] == 128
    rep = verified_once(base, ckpt, **FULL)
    assert rep.parity and rep.greedy_equal


@pytest.mark.parametrize("arch", CASES["pipeline"])
def test_pipeline_parallel_families(store, tmp_path, arch):
    """Per-layer behaviour keyed on the global layer index (Gemma3 local/global RoPE) and families
    whose TensorRT-LLM class sends hidden states between stages, under pp 2."""
    base = tiny_base(store, arch)
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, pp_size=2,
                      allow_unsupported=arch in CASES["unsupported"])  # the family's own check verdict
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=8)
    assert_proven(rep)


@pytest.mark.parametrize("arch", sorted(cls.hf_architectures[0] for cls in dict.fromkeys(registry().values())
                                        if cls.position_embedding is PositionEmbedding.LEARNED_ABSOLUTE))
@pytest.mark.parametrize("sharding_dim", [0, 1])
def test_learned_position_tables_split_like_the_vocabulary(store, tmp_path, arch, sharding_dim):
    """--use_parallel_embedding splits the position table as it splits the vocabulary (parallelize_embedding
    takes every Embedding), and the tree tokens still sit at their sequence position plus their offset."""
    from safetensors.torch import load_file

    base = tiny_base(store, arch)
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, use_parallel_embedding=True,
                      embedding_sharding_dim=sharding_dim)
    table = load_file(str(ckpt / "rank1.safetensors"))["transformer.position_embedding.weight"]
    assert table.shape == ((128, 64) if sharding_dim == 0 else (256, 32))
    assert_proven(verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6))
    # the base's table as the family declares it (its tensor, and its rows from position 0: OPT's start at 2)
    adapter = registry()[arch]()
    hf = load_file(str(base / "model.safetensors"))
    whole = hf[f"{adapter.names[Role.POSITION_EMBEDDING]}.weight"]
    moved = adapter.deviations(HFConfig.read(base)).get(Role.POSITION_EMBEDDING)
    whole = moved.combine([whole]) if moved is not None and moved.combine is not None else whole
    assert torch.equal(table, whole[128:] if sharding_dim == 0 else whole[:, 32:])


@pytest.mark.parametrize("arch", CASES["no_pipeline"])
def test_pipeline_parallel_refused_where_the_engine_class_has_none(store, tmp_path, arch):
    base = tiny_base(store, arch)
    with pytest.raises(ConversionError) as err:
        convert_to(tmp_path / "c", base, heads_once(base), pp_size=2, allow_unsupported=True)
    assert "[engine-pipeline-parallel]" in err.value.what and "pp_size 2 cannot be built" in err.value.what
    assert adapter_for(arch).trtllm_module in err.value.what and not (tmp_path / "c").exists()


#: non-default values per family for the keys its adapter writes and its reference semantics reads
#: back (ArchAdapter.key_cases; families whose TensorRT-LLM class fixes the LayerNorm epsilon keep 1e-5:
#: engine-class-limit); ALiBi families have no RoPE keys to read back
ROUND_TRIP = {arch: keys for arch, tiny, keys in CASES["key_cases"] if arch == tiny and arch not in ALIBI}


@pytest.mark.parametrize("arch", sorted(ROUND_TRIP))
def test_semantics_read_back_every_written_key(store, tmp_path, arch):
    """Config keys the adapter writes are read back without defaults: with values that all differ
    from the defaults, a key written under one name and read under another cannot pass."""
    import shutil

    base = tmp_path / "base"
    shared = tiny_base(store, arch)
    shutil.copytree(shared, base)
    cfg = json.loads((base / "config.json").read_text())
    for k, v in ROUND_TRIP[arch].items():  # a dotted key is a path into a nested object (files/hf_model.py)
        assign(cfg["rope_parameters"] if k in ("rope_theta", "partial_rotary_factor") and "rope_parameters" in cfg
               else cfg, k, v)
    (base / "config.json").write_text(json.dumps(cfg))
    # the shared base's heads: the keys changed leave the hidden size and the vocabulary as they are
    ckpt = convert_to(tmp_path / "c", base, heads_once(shared), allow_unsupported=arch in CASES["unsupported"])
    sem = ReferenceModel(ckpt).semantics
    want = ROUND_TRIP[arch]
    adapter = adapter_for(arch)
    if adapter.rope_theta_key in want:  # the family's own RoPE key (DBRX's attn_config.rope_theta)
        assert sem.rotary_base == want[adapter.rope_theta_key]
    if adapter.norm_epsilon_key in want:  # the family's own epsilon key, not a list of the ones met so far
        assert sem.norm_epsilon == want[adapter.norm_epsilon_key]
    assert sem.position_embedding is adapter.position_embedding  # keyed on the family's kind, not "not ALiBi"
    if sem.position_embedding.is_rope:
        head = json.loads((ckpt / "config.json").read_text())["head_size"]
        pct = want.get("partial_rotary_factor", adapter.hf_defaults.get("partial_rotary_factor", 1.0))
        assert sem.rotary_dim == (want.get("rotary_dim") or int(head * pct))
    if adapter.experts_per_token_key in want:
        assert sem.moe_top_k == want[adapter.experts_per_token_key]


def test_granite_multipliers_reach_the_reference_semantics(store, tmp_path):
    base, ckpt = family_checkpoint("GraniteForCausalLM", 1)
    hf = json.loads((base / "config.json").read_text())
    cfg = json.loads((ckpt / "config.json").read_text())
    sem = ReferenceModel(ckpt).semantics
    head = cfg["head_size"]
    # LLaMAConfig stores the softmax scale times sqrt(head_size) and 1 / logits_scaling
    assert cfg["attention_multiplier"] == pytest.approx(hf["attention_multiplier"] * head**0.5)
    assert cfg["output_multiplier_scale"] == pytest.approx(1 / hf["logits_scaling"])
    assert (sem.embedding_scale, sem.residual_scale) == (hf["embedding_multiplier"], hf["residual_multiplier"])
    assert sem.attention_scale == pytest.approx(hf["attention_multiplier"])
    assert sem.logits_scale == pytest.approx(1 / hf["logits_scaling"])


# what a hand port writes for each Granite field: the key left out (the engine's default), or the
# Hugging Face attention_multiplier without the sqrt(head_size) factor LLaMAConfig expects
@pytest.mark.parametrize("key, wrong", [("embedding_multiplier", 1.0), ("residual_multiplier", 1.0),
                                        ("output_multiplier_scale", 1.0), ("attention_multiplier", "hf")])
def test_a_granite_checkpoint_missing_a_multiplier_fails_verify(store, tmp_path, key, wrong):
    # weights large enough that the attention scale shows in the logits (with 0.02, softmax is flat)
    base, intact = family_checkpoint("GraniteForCausalLM", 1, initializer_range=0.2)
    good = verified_once(base, intact, **SHORT)
    assert good.parity
    ckpt = _copy(intact, tmp_path)
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    cfg[key] = json.loads((base / "config.json").read_text())["attention_multiplier"] if wrong == "hf" else wrong
    path.write_text(json.dumps(cfg))
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert not rep.parity, f"{key} = {cfg[key]} went unnoticed"


#: every mixture-of-experts family (an engine class that reads ``moe``)
MOE_ARCHITECTURES = CASES["moe"]


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_expert_parallelism_splits_the_experts_and_verifies(tmp_path, store, arch):
    """--moe_ep_size 2 at tp 2: each rank holds half the experts whole (moe_tp_size 1), the mapping says so, and
    the executor, simulating the ranks, still computes the base; the stand-in builds the experts' shapes."""
    from safetensors.torch import load_file

    base = tiny_base(store, arch)
    heads = heads_once(base)
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                 str(tmp_path / "ep"), "--tp_size", "2", "--moe_ep_size", "2", "--dtype", "float32", "--quiet"]) == 0
    cfg = json.loads((tmp_path / "ep" / "config.json").read_text())
    assert (cfg["mapping"]["moe_tp_size"], cfg["mapping"]["moe_ep_size"]) == (1, 2)
    experts = adapter_for(arch).num_experts(HFConfig.read(base))  # by the family's own keys
    r0, r1 = (load_file(tmp_path / "ep" / f"rank{r}.safetensors") for r in (0, 1))
    fc0, fc1 = r0["transformer.layers.0.mlp.fc.weight"], r1["transformer.layers.0.mlp.fc.weight"]
    assert fc0.shape[0] == experts // 2 and not torch.equal(fc0, fc1)  # other experts, each whole
    _, full = family_checkpoint(arch, 1)  # a float32 base: float32 ("auto")
    whole = load_file(full / "rank0.safetensors")["transformer.layers.0.mlp.fc.weight"]
    assert torch.equal(torch.cat([fc0, fc1]), whole)
    rep = verify(base, tmp_path / "ep", medusa_choices=TREE, max_new_tokens=6)
    assert_proven(rep)
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                 str(tmp_path / "bad"), "--tp_size", "2", "--moe_ep_size", "3", "--quiet"]) == 1
    assert not (tmp_path / "bad").exists()


def test_expert_count_is_read_in_both_spellings_and_is_zero_for_a_dense_family():
    """num_experts (Qwen's configs) or num_local_experts (Mixtral, Granite, transformers 5's Qwen3-MoE), one reader;
    a dense family reads none of them, even from a config that carries the key."""
    def count(arch, **fields):
        hf = HFConfig(data={"num_experts_per_tok": 2, **fields}, path=Path("config.json"))
        return adapter_for(arch).num_experts(hf), adapter_for(arch).top_k(hf)

    assert count("Qwen3MoeForCausalLM", num_local_experts=6) == (6, 2)
    assert count("Qwen2MoeForCausalLM", num_experts=5) == (5, 2)
    assert count("MixtralForCausalLM", num_local_experts=8) == (8, 2)
    assert count("LlamaForCausalLM", num_local_experts=8) == (0, 0)
    with pytest.raises(ModelError, match="'num_experts' or 'num_local_experts' is missing"):
        count("GraniteMoeForCausalLM")


def test_expert_parallelism_is_refused_on_a_dense_base(tmp_path, store, capsys):
    base = tiny_base(store, "LlamaForCausalLM")
    rc = main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads_once(base)),
               "--output_dir", str(tmp_path / "o"), "--tp_size", "2", "--moe_ep_size", "2", "--quiet"])
    assert rc == 1 and "without experts" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", "h", "--output_dir", str(tmp_path / "o"),
                 "--tp_size", "4", "--moe_tp_size", "3", "--quiet"]) == 2


def test_expert_parallelism_with_pipeline_stages_verifies(tmp_path, store):
    base = tiny_base(store, "MixtralForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, pp_size=2, moe_ep_size=2)
    assert json.loads((ckpt / "config.json").read_text())["mapping"]["moe_ep_size"] == 2
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert_proven(rep)


def test_expert_and_tensor_parallelism_together_verify(tmp_path, store):
    """tp 4 as moe_ep_size 2 x moe_tp_size 2: each rank holds half the experts, each split in two."""
    from safetensors.torch import load_file

    base = tiny_base(store, "MixtralForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=4, moe_ep_size=2, dtype="float32")
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["mapping"]["moe_tp_size"], cfg["mapping"]["moe_ep_size"]) == (2, 2)
    fc = load_file(ckpt / "rank3.safetensors")["transformer.layers.1.mlp.fc.weight"]
    assert tuple(fc.shape) == (2, 96, 64)  # 4 experts / 2, 2 x 96 / 2, hidden
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert_proven(rep)


def test_a_sequence_past_the_learned_position_table_is_refused_by_check(store, tmp_path):
    from trtllm_medusa_ports.api import CheckOptions
    from trtllm_medusa_ports.api import check as api_check

    base = tiny_base(store, "GPT2LMHeadModel")  # n_positions 256
    default = api_check(CheckOptions(model_dir=base))
    [f] = [f for f in default.findings if f.rule == "learned-position-range"]
    assert f.severity == "warning" and "past the learned position table's 256 rows" in f.message
    assert "--max_seq_len 252" in f.fix  # mc_sim_7b_63: 4 deep
    given = api_check(CheckOptions(model_dir=base, max_seq_len=256))
    assert not given.compatible and any(f.rule == "learned-position-range" and f.severity == "error"
                                        for f in given.findings)
    ok = api_check(CheckOptions(model_dir=base, max_seq_len=252))
    assert not [f for f in ok.findings if f.rule == "learned-position-range"]
    rope = api_check(CheckOptions(model_dir=tiny_base(store, "Qwen2ForCausalLM"), max_seq_len=10**4))
    assert not [f for f in rope.findings if f.rule == "learned-position-range"]


def test_the_allow_unsupported_note_says_what_the_executor_computes_for_each_rule(store, tmp_path):
    """ALiBi: the executor computes the base's attention, which no Medusa engine computes - the note must not claim
    the engine's arithmetic; an engine divergence (computed as the engine does) says so."""
    base, ckpt = family_checkpoint("BloomForCausalLM", 1)  # allow_unsupported (ALiBi)
    notes = [n for n in verified_once(base, ckpt, **FULL).notes if "--allow_unsupported" in n]
    assert notes and all("[alibi-position-embedding]" in n and "the base's ALiBi attention" in n for n in notes)
    assert not any("what the engine would" in n for n in notes)


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_every_key_a_family_reads_left_out_is_a_default_or_a_named_error(store, tmp_path, arch):
    """Issue 79, 2: each key of the family's saved config.json deleted in turn - transformers' save_pretrained
    leaves out values equal to the config class's defaults - gives check's base rules and the checkpoint's config
    (what convert writes) either the family's default or a PortError naming the file; never a KeyError or
    TypeError traceback."""
    from trtllm_medusa_ports.compat import check_base
    from trtllm_medusa_ports.errors import PortError

    saved = json.loads((tiny_base(store, arch) / "config.json").read_text())
    adapter = registry()[arch]()
    for key in [k for k in saved if k != "architectures"]:
        cfg = {k: v for k, v in saved.items() if k != key}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        try:
            hf = HFConfig.read(tmp_path)
            check_base(hf, None)
            adapter.engine_config(hf)
        except PortError as exc:
            assert str(tmp_path) in (exc.where or "") or key in exc.what, (key, exc.what, exc.where)
        except Exception as exc:  # noqa: BLE001  (what the test exists to catch)
            raise AssertionError(f"{arch}: config.json without {key}: {type(exc).__name__}: {exc}") from None


def test_an_architecture_without_an_adapter_is_refused_by_one_rule_naming_the_supported(tmp_path):
    """No architecture is refused by name outside the registry (issue 79: OPT's hand-written refusal had to be
    found and removed): one rule names what is supported, OPT among it since it has its adapter."""
    from trtllm_medusa_ports.compat import check_base

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["XGLMForCausalLM"], "model_type": "xglm"}))
    [f] = check_base(HFConfig.read(tmp_path), None)
    assert f.rule == "unsupported-architecture" and "no adapter for architecture 'XGLMForCausalLM'" in f.message
    assert "OPTForCausalLM" in f.fix and "docs/porting-guide.md" in f.fix


def test_gemma3_global_layers_follow_layer_types_not_a_stale_pattern(tmp_path):
    """transformers 4.57 saves ``_sliding_window_pattern: 6`` beside the ``layer_types`` it runs by (TensorRT-LLM
    1.2's pinned version): the engine's pattern comes from the layer types, and a layout no pattern makes is a
    divergence check reports."""
    ad = adapter_for("Gemma3ForCausalLM")
    data = dict(TINY_CONFIGS["Gemma3ForCausalLM"], architectures=["Gemma3ForCausalLM"], _sliding_window_pattern=6)
    hf = HFConfig(data, tmp_path / "config.json")
    assert ad.trtllm_config(hf)["_sliding_window_pattern"] == 2 and not ad.engine_divergences(hf)
    twelve = HFConfig(dict(data, num_hidden_layers=12, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2),
                      tmp_path / "config.json")
    assert ad.trtllm_config(twelve)["_sliding_window_pattern"] == 6
    odd = HFConfig(dict(data, layer_types=["full_attention", "sliding_attention"]), tmp_path / "config.json")
    (problem, fix), = ad.engine_divergences(odd)
    assert "is no pattern TensorRT-LLM's Gemma 3 can build" in problem and "--allow_unsupported" in fix
    assert ad.trtllm_config(odd)["_sliding_window_pattern"] == 6  # the pattern keys, as written with the override


def test_a_soft_capped_base_loads_with_transformers_eager_attention(store):
    """sdpa skips Gemma 2's attention soft-capping, and transformers before 5 picks it (4.57's logits then differ from
    the model's by tens): a base with attn_logit_softcapping loads eager; any other keeps transformers' default."""
    from trtllm_medusa_ports.files.hf_model import transformers_load_kwargs
    from trtllm_medusa_ports.huggingface.model import load_hf_model

    gemma2, llama = tiny_base(store, "Gemma2ForCausalLM"), tiny_base(store, "LlamaForCausalLM")
    assert transformers_load_kwargs(gemma2)["attn_implementation"] == "eager"
    assert "attn_implementation" not in transformers_load_kwargs(llama)
    assert load_hf_model(gemma2, torch.float32).config._attn_implementation == "eager"


def test_config_fields_are_read_through_paths_into_nested_objects(tmp_path):
    """Issue 66, 1: DBRX and MPT keep attention and MLP settings in objects of their own; a dotted name is a path
    into them (files/hf_model.py ``lookup`` / ``assign``), for reads, required fields and the family's defaults."""
    from trtllm_medusa_ports.errors import ModelError
    from trtllm_medusa_ports.files.hf_model import HFConfig, lookup

    cfg = {"architectures": ["MptForCausalLM"], "attn_config": {"clip_qkv": 0.5, "inner": {"x": 3}}, "d_model": 8}
    assign(cfg, "ffn_config.moe_top_k", 2)
    assign(cfg, "attn_config.inner.y", 4)
    assert cfg["ffn_config"] == {"moe_top_k": 2} and cfg["attn_config"]["inner"] == {"x": 3, "y": 4}
    assert lookup(cfg, "attn_config.inner.x") == 3 and lookup(cfg, "attn_config.missing", "d") == "d"
    assert lookup(cfg, "d_model.x", "d") == "d"  # a path through a number ends there
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = HFConfig.read(tmp_path)
    assert hf.get("attn_config.clip_qkv") == 0.5 and hf.require("ffn_config.moe_top_k") == 2
    with pytest.raises(ModelError) as err:
        hf.require("ffn_config.moe_num_experts")
    assert "'ffn_config.moe_num_experts' is missing" in err.value.what
    # the family's nested default where config.json leaves the field out (MptAttentionConfig's alibi_bias_max)
    mpt = adapter_for("MptForCausalLM")
    assert mpt.hf_value(hf, "attn_config.alibi_bias_max") == 8 and mpt.hf_value(hf, "attn_config.clip_qkv") == 0.5
    assert mpt.alibi_reason(hf) and mpt.intermediate_size(hf) == 32  # MptConfig's expansion_ratio 4
    full = dict(cfg, n_layers=1, n_heads=2, vocab_size=16, attn_config={"clip_qkv": 0.5, "alibi": False})
    (tmp_path / "config.json").write_text(json.dumps(full))
    written = mpt.trtllm_config(HFConfig.read(tmp_path))
    assert (written["clip_qkv"], written["alibi_bias_max"], written["position_embedding_type"]) == (
        0.5, 8, "learned_absolute")


def test_a_norm_epsilon_without_a_config_key_is_the_modules_own(tmp_path):
    """Issue 66, 1: a family whose config has no epsilon key (DBRX: bias-free nn.LayerNorm, 1e-5) declares the one
    its norms are built with; a config value under another family's key is not read for it, and a class that
    declares neither fails when it is defined."""
    from trtllm_medusa_ports.archs.llama import LlamaAdapter
    from trtllm_medusa_ports.files.hf_model import HFConfig

    class NoKey(LlamaAdapter):  # not registered
        norm_epsilon_key = None
        fixed_norm_epsilon = 1e-5

    cfg = dict(adapter_for("LlamaForCausalLM").tiny_config, architectures=["LlamaForCausalLM"], rms_norm_eps=3e-6)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = HFConfig.read(tmp_path)
    assert NoKey().trtllm_config(hf)["norm_epsilon"] == 1e-5 and NoKey().norm_epsilon(hf) == 1e-5
    assert adapter_for("LlamaForCausalLM").trtllm_config(hf)["norm_epsilon"] == 3e-6
    with pytest.raises(TypeError, match="declare fixed_norm_epsilon"):
        class Neither(LlamaAdapter):
            norm_epsilon_key = None


@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 1), (2, 2)])
def test_dbrx_rank_files_hold_upstreams_convert_hf_dbrx_tensors(store, tmp_path, tp, ep):
    """Issue 66: every DBRX tensor as upstream's converter writes it (examples/models/contrib/dbrx/
    convert_checkpoint.py ``convert_hf_dbrx``, restated here from its reading): Wqkv's q, k and v each cut over tp;
    out_proj by its input; per expert fc = [v1; w1] and proj = w2 per expert transposed, the experts cut over
    moe_ep_size and their intermediate dim over moe_tp_size; the router in float32; norms, embedding and lm_head."""
    from conftest import convert_to, heads_once, tiny_base
    from safetensors.torch import load_file

    base = tiny_base(store, "DbrxForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=tp, moe_ep_size=ep, dtype="float32")
    src = load_file(str(base / "model.safetensors"))
    cfg = json.loads((base / "config.json").read_text())
    hidden, heads, kv = cfg["d_model"], cfg["n_heads"], cfg["attn_config"]["kv_n_heads"]
    experts, ffn, head = cfg["ffn_config"]["moe_num_experts"], cfg["ffn_config"]["ffn_hidden_size"], hidden // heads
    moe_tp = tp // ep

    def part(t, n, i, dim):
        return torch.chunk(t, n, dim=dim)[i]

    for rank in range(tp):
        got = load_file(str(ckpt / f"rank{rank}.safetensors"))
        ep_rank, tpm_rank = rank % ep, rank // ep
        for i in range(cfg["n_layers"]):
            p, t = f"transformer.blocks.{i}.", f"transformer.layers.{i}."
            q, k, v = torch.split(src[p + "norm_attn_norm.attn.Wqkv.weight"], [hidden, kv * head, kv * head])
            want = {
                "attention.qkv.weight": torch.cat([part(x, tp, rank, 0) for x in (q, k, v)]),
                "attention.dense.weight": part(src[p + "norm_attn_norm.attn.out_proj.weight"], tp, rank, 1),
                "input_layernorm.weight": src[p + "norm_attn_norm.norm_1.weight"],
                "post_layernorm.weight": src[p + "norm_attn_norm.norm_2.weight"],
                "mlp.router.weight": src[p + "ffn.router.layer.weight"].float(),
            }
            gate, up, down = (src[p + f"ffn.experts.mlp.{n}"].reshape(experts, ffn, hidden) for n in ("w1", "v1", "w2"))
            gate, up = (part(part(x, ep, ep_rank, 0), moe_tp, tpm_rank, 1) for x in (gate, up))
            want["mlp.fc.weight"] = torch.cat([up, gate], dim=-2)
            want["mlp.proj.weight"] = part(part(down.transpose(1, 2), ep, ep_rank, 0), moe_tp, tpm_rank, 2)
            for name, w in want.items():
                assert torch.equal(got[t + name], w.contiguous()), (rank, t + name)
        assert torch.equal(got["transformer.vocab_embedding.weight"], src["transformer.wte.weight"])
        assert torch.equal(got["transformer.ln_f.weight"], src["transformer.norm_f.weight"])
        assert torch.equal(got["lm_head.weight"], part(src["lm_head.weight"], tp, rank, 0))
    written = json.loads((ckpt / "config.json").read_text())
    assert written["norm_epsilon"] == 1e-5 and written["clip_qkv"] == cfg["attn_config"]["clip_qkv"]
    assert written["mapping"]["moe_ep_size"] == ep and written["moe"]["normalization_mode"] == 1


def test_every_family_says_where_upstreams_converter_for_it_lives():
    """Issue 66, 2: each family class with a tiny model names upstream's converter it restates (a file of
    NVIDIA/TensorRT-LLM under tensorrt_llm/models/ or examples/models/), declared by the class itself."""
    import re

    from trtllm_medusa_ports.archs.registry import own

    pattern = re.compile(r"(tensorrt_llm/models/[a-z0-9_]+|examples/models/(core|contrib)/[a-z0-9_]+)/[a-z_]+\.py")
    checked = 0
    for cls in dict.fromkeys(registry().values()):
        if own(cls, "tiny_config") is None:
            continue
        path = own(cls, "upstream_converter")
        assert path and pattern.fullmatch(path), (cls.__name__, path)
        checked += 1
    assert checked >= 25


def test_every_pitfall_the_guide_lists_names_tests_that_exist():
    """Issue 79, 2: the porting guide's pitfalls are rendered from archs/pitfalls.py (the list test above holds the
    document to it), and each names the family-wide tests that fail on it: a renamed or removed test fails here, so
    the guide never points at a check the suite does not run."""
    import ast

    from trtllm_medusa_ports.archs.pitfalls import PITFALLS, rendered

    root = Path(__file__).resolve().parent.parent
    named = [t for p in PITFALLS for t in p.caught_by]
    assert len(PITFALLS) >= 10 and len(named) >= 10
    for test in named:
        path, _, name = test.partition("::")
        tree = ast.parse((root / path).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, test
    text = rendered()
    assert all(f"**{p.title}**" in text for p in PITFALLS) and "no test catches it" in text
    assert rendered() in (root / "docs" / "porting-guide.md").read_text()
