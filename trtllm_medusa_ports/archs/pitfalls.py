"""What tripped earlier ports, each with the family-wide test that fails when a new family falls into it.

The porting guide's list of pitfalls is rendered from :data:`PITFALLS` (``python -m trtllm_medusa_ports.families
--write``, the ``pitfalls`` list), and ``tests/test_families.py`` holds every ``caught_by`` to a test function that
exists: the guide cannot name a check the suite does not run. A pitfall no test catches says so.

May import: nothing of the package (data only).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pitfall:
    #: what goes wrong, in a few words (rendered bold)
    title: str
    #: what to do instead
    advice: str
    #: ``tests/<file>.py::<test function>`` of each test that fails on it; empty: none does
    caught_by: tuple[str, ...] = ()


_ENGINE = "tests/test_engine.py::"
_FAMILIES = "tests/test_families.py::"

PITFALLS: tuple[Pitfall, ...] = (
    Pitfall("the upstream folder is not always the family's name",
            "Cohere's class lives in `tensorrt_llm/models/commandr/`: declare it as `trtllm_module = \"commandr\"`",
            (_ENGINE + "test_every_family_builds_through_upstreams_route",)),
    Pitfall("a limit of this port is not an engine limit",
            "a feature TensorRT-LLM's class serves but this project does not convert yet (Cohere's `use_qk_norm`) "
            "goes to `port_limits(hf)` (rule `port-limit`); what the class itself cannot represent goes to "
            "`engine_limits(hf)` (rule `engine-class-limit`); each with a `check_cases` entry",
            (_FAMILIES + "test_each_declared_limit_is_an_error_check_gives",
             _FAMILIES + "test_families_declare_their_limits_as_check_cases")),
    Pitfall("read config values with the family's own defaults",
            "`save_pretrained` leaves out values equal to the config class's defaults, so a missing "
            "`tie_word_embeddings` means True for Cohere and False for Llama, and a LayerNorm family's epsilon key "
            "is not `rms_norm_eps`: declare `hf_defaults`; a key read without one must be a named error",
            (_FAMILIES + "test_every_family_declares_its_own_hf_defaults_and_they_are_transformers",
             _FAMILIES + "test_every_key_a_family_reads_left_out_is_a_default_or_a_named_error")),
    Pitfall("keys a parent family writes may not exist in your class",
            "Cohere's class has no `mlp_bias`: override what the adapter writes",
            (_ENGINE + "test_every_key_an_adapter_writes_is_read_by_the_build",)),
    Pitfall("transformers 5 moves RoPE fields into `rope_parameters`",
            "read `rope_theta` and `partial_rotary_factor` through `HFConfig`, and give the family's own default "
            "where neither place has the field (Nemotron's factor is 0.5, not 1)",
            (_FAMILIES + "test_a_rope_fraction_left_out_of_config_json_is_the_familys_default",)),
    Pitfall("an activation, a norm or a layout the package lacks is a capability, not a family detail",
            "land it first, tested on its own, in the executor (and the stand-in's `functional.py` where upstream "
            "has it); the family's verify fails until the executor computes what transformers does",
            (_FAMILIES + "test_family_converts_and_verifies",)),
    Pitfall("a tiny config gets transformers' default token ids",
            "`eos_token_id` 255000 on Cohere falls outside a tiny vocabulary: set `bos_token_id`, `eos_token_id` "
            "and `pad_token_id` in `tiny_config`"),
    Pitfall("the upstream converter may live in `examples/models/contrib/<family>/convert_checkpoint.py`",
            "OPT, DBRX and GPT-NeoX are converted there, not in `tensorrt_llm/models/<family>/convert.py`: name the "
            "file in `upstream_converter` and read it whole",
            (_FAMILIES + "test_every_family_says_where_upstreams_converter_for_it_lives",)),
    Pitfall("an engine default can be the opposite of transformers'",
            "TensorRT-LLM's `OPTForCausalLM.check_config` defaults `do_layer_norm_before` to False where "
            "transformers' OPTConfig says True: write the key whatever the base says (`trtllm_config`) and list it "
            "in `engine_keys`",
            (_ENGINE + "test_keys_reach_the_engine_class_with_non_default_values",)),
    Pitfall("a key that changes which tensors exist is a test variant",
            "OPT's `do_layer_norm_before` (a post-norm OPT has no final norm) goes to `test_variants`, not "
            "`key_cases` (which edits config.json over the same weights); drop the role from `weight_sources(hf)` "
            "where the config says it is absent",
            (_FAMILIES + "test_semantics_read_back_every_written_key", _FAMILIES + "test_family_converts_and_verifies")),
    Pitfall("an upstream class may take `PretrainedConfig`",
            "GPT-NeoX, Bloom, MPT and OPT have no `<Family>Config`: declare `upstream_config_class = False`; the "
            "stand-in's `MODEL_MAP` is held to the declarations",
            (_ENGINE + "test_standin_config_class_exactly_where_upstream_has_one",)),
)


def rendered() -> str:
    """The guide's list: one bullet per pitfall, with the tests that catch it."""
    lines = []
    for p in PITFALLS:
        caught = ("caught by " + ", ".join(f"`{t}`" for t in p.caught_by) if p.caught_by
                  else "no test catches it: a reviewer has to")
        lines.append(f"\n- **{p.title}**: {p.advice} ({caught});")
    return "".join(lines)[:-1] + ".\n"
