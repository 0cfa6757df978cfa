"""Chat templates (issue 65, 7): train-heads, tune-tree and verify feed text prompts to the base as it is served - through
the tokenizer's chat template where it has one (--chat_template auto, the default; none: as they are) - and say
what they did in their result."""

import json

import pytest
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.files.prompts import lazy_tokenizer, read_items
from trtllm_medusa_ports.files.tokenizer import CHAT_APPLIED, CHAT_NONE, CHAT_OFF, CHAT_UNUSED
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
)

ARCH = "Qwen2ForCausalLM"
#: a user turn between t1 and t2, the generation prompt t3: words of the tiny tokenizer's vocabulary
TEMPLATE = "{% for m in messages %}t1 {{ m['content'] }} t2{% endfor %}{% if add_generation_prompt %} t3{% endif %}"


@pytest.fixture
def chat_tok(tmp_path):
    """The tiny word-level tokenizer with a chat template (a directory of its own: beside a Qwen2 config.json,
    transformers would build Qwen2's BPE tokenizer instead)."""
    tok = save_tiny_tokenizer(tmp_path / "chat-tok", tiny_config(ARCH).vocab_size)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return tok


def test_prompts_go_through_the_template_and_sequences_do_not(chat_tok, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "t5 t6"}) + "\n" + json.dumps({"text": "t7 t8"}) + "\n")
    tok = lazy_tokenizer(chat_tok, "auto")
    items = read_items(api.PromptInputs(data=data), tok)
    assert [(it.ids, it.continue_it) for it in items] == [([1, 5, 6, 2, 3], True), ([7, 8], False)]
    assert tok.chat == CHAT_APPLIED
    plain = lazy_tokenizer(chat_tok, "none")
    assert read_items(api.PromptInputs(prompt=["t5 t6"]), plain)[0].ids == [5, 6] and plain.chat == CHAT_OFF


def test_train_heads_and_tune_tree_say_what_they_did(chat_tok, store, tmp_path, capsys):

    fit = api.FitOptions(num_heads=2, steps=2, quiet=True, distill=0.0, matmul_dtype="float32")
    prompts = api.PromptInputs(prompt=["t5 t6 t7", "t8 t9"])
    base = tiny_base(store, ARCH)
    res = api.train_heads(api.TrainOptions(base, tmp_path / "h", prompts=prompts, new_tokens=4, fit=fit,
                                           tokenizer_dir=chat_tok))
    assert res.chat_template == CHAT_APPLIED and res.to_dict()["chat_template"] == CHAT_APPLIED
    assert res.sequences == 2 and f"chat template {CHAT_APPLIED}" in res.summary()
    off = api.train_heads(api.TrainOptions(base, tmp_path / "h2", prompts=prompts, new_tokens=4, fit=fit,
                                           chat_template="none", tokenizer_dir=chat_tok))
    assert off.chat_template == CHAT_OFF
    ids = api.train_heads(api.TrainOptions(base, tmp_path / "h3", new_tokens=4, fit=fit,
                                           prompts=api.PromptInputs(prompt_ids=[[5, 6, 7]])))
    assert ids.chat_template == CHAT_UNUSED


def test_tune_tree_passes_on_what_it_did(chat_tok, store, tmp_path, monkeypatch):
    """tune-tree's prompts are tokenized by the API (options/prompts.py prompt_token_ids) and what was done reaches
    the result (the measurement itself is test_train_tune's)."""
    import trtllm_medusa_ports.trees.tune as tune_mod
    from trtllm_medusa_ports.options.prompts import prompt_token_ids

    base = tiny_base(store, ARCH)
    prompts = api.PromptInputs(prompt=["t5 t6"])
    assert prompt_token_ids(prompts, base, chat_tok, "auto") == ([[1, 5, 6, 2, 3]], CHAT_APPLIED)
    assert prompt_token_ids(prompts, base, chat_tok, "none") == ([[5, 6]], CHAT_OFF)
    plain = save_tiny_tokenizer(tmp_path / "tok", tiny_config(ARCH).vocab_size)
    assert prompt_token_ids(prompts, base, plain, "auto") == ([[5, 6]], CHAT_NONE)
    seen = {}

    def fake_tune(model_dir, medusa_model_dir, **kw):
        seen.update(kw)
        return tune_mod.TuneResult([[0]], [[1.0]], 1.0, 1.0, 1, "product", chat_template=kw["chat_status"])

    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    heads = save_heads(random_heads(tiny_config(ARCH).hidden_size, tiny_config(ARCH).vocab_size, num_heads=2),
                       tmp_path / "rh")
    res = api.tune_tree(api.TuneOptions(base, heads, prompts=prompts, tokenizer_dir=chat_tok))
    assert seen["prompt_ids"] == [[1, 5, 6, 2, 3]] and res.to_dict()["chat_template"] == CHAT_APPLIED
    assert f"chat template {CHAT_APPLIED}" in res.render()


def test_calibration_prompts_go_through_the_template_and_verify_reads_them_again_so(chat_tok, store, tmp_path):
    """convert's calibration prompts (here the packaged ones) through the chat template; the record says so and
    verify re-derives the scales from the same ids; without that word in the record the samples are not the ones
    calibrated on, and verify says so."""
    from conftest import convert_to

    wide = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    base = tiny_base(store, "LlamaForCausalLM", **wide)
    heads = save_heads(random_heads(128, tiny_config("LlamaForCausalLM").vocab_size, num_heads=2, seed=5),
                       tmp_path / "heads")
    ckpt = convert_to(tmp_path / "fp8", base, heads, dtype="float16", qformat="fp8", tokenizer_dir=chat_tok,
                      calib_size=4)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["medusa_ports"]["calibration"]["chat_template"] == CHAT_APPLIED
    rep = api.verify(api.VerifyOptions(base, ckpt, max_new_tokens=3, quiet=True, min_quant_agreement=0.0))
    assert rep.ok and not rep.quant_scales_not_rederived, rep.render()
    plain = convert_to(tmp_path / "fp8-plain", base, heads, dtype="float16", qformat="fp8", tokenizer_dir=chat_tok,
                       calib_size=4, chat_template="none")
    plain_record = json.loads((plain / "config.json").read_text())["medusa_ports"]["calibration"]
    assert plain_record["chat_template"] == CHAT_OFF and plain_record["sha256"] != cfg["medusa_ports"]["calibration"][
        "sha256"]
    del cfg["medusa_ports"]["calibration"]["chat_template"]  # an older record: read again without the template
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rep = api.verify(api.VerifyOptions(base, ckpt, max_new_tokens=3, quiet=True, min_quant_agreement=0.0))
    assert not rep.ok and "changed since the conversion" in rep.quant_scales_not_rederived, rep.render()


#: templates that do not render a user turn (issue 76, C), with the line and the message the error must name
BROKEN = {
    "raise_exception": ("{% if messages[0]['role'] == 'user' %}\n{{ raise_exception('Only system roles') }}{% endif %}",
                        "line 2", "Only system roles"),
    "syntax": ("{% for m in messages %}{{ m['content'] }", "line 1", "TemplateSyntaxError"),
    "undefined": ("t1\nt2\n{{ messages[5]['content'] }}", "line 3", "UndefinedError"),
    "zero_division": ("t1\n{{ 1 // 0 }}", "line 2", "ZeroDivisionError"),
    "type": ("{{ messages + 1 }}", "line 1", "TypeError"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "line 1", "RecursionError"),
    "not_text": (5, "no line known", "TypeError"),
    "named_without_default": ({"tool_use": "t1"}, "no line known", "multiple chat templates"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_template_that_does_not_render_is_named_with_its_line(case, store, tmp_path, capsys):
    """No traceback from a chat template (issue 76, C): the error names the template's source, its line and
    jinja2's message, exit 1, and says how to go on without it."""
    from trtllm_medusa_ports.cli import main
    from trtllm_medusa_ports.errors import PortError

    template, line, message = BROKEN[case]
    tok = save_tiny_tokenizer(tmp_path / "tok", tiny_config(ARCH).vocab_size)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    with pytest.raises(PortError) as err:
        lazy_tokenizer(tok, "auto").prompt("t5 t6")
    e = err.value
    assert e.where == f"{tok / 'tokenizer_config.json'}, chat_template"
    assert f"({line}" in e.what and message in e.what and "--chat_template none" in e.fix
    assert lazy_tokenizer(tok, "none").prompt("t5 t6") == [5, 6]
    heads = save_heads(random_heads(tiny_config(ARCH).hidden_size, tiny_config(ARCH).vocab_size, num_heads=2),
                       tmp_path / "h")
    capsys.readouterr()
    rc = main(["tune-tree", "--model_dir", str(tiny_base(store, ARCH)), "--medusa_model_dir", str(heads),
               "--tokenizer_dir", str(tok), "--prompt", "t5 t6", "--output", str(tmp_path / "tree.json")])
    err_text = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err_text and message in err_text, err_text
    assert not (tmp_path / "tree.json").exists()


def test_a_template_read_from_its_own_file_is_named_by_that_file(tmp_path):
    from trtllm_medusa_ports.errors import PortError

    tok = save_tiny_tokenizer(tmp_path / "tok", tiny_config(ARCH).vocab_size)
    (tok / "chat_template.jinja").write_text("t1\n\n{{ messages.role.x }}\n")
    with pytest.raises(PortError) as err:
        lazy_tokenizer(tok, "auto").prompt("t5")
    assert err.value.where == str(tok / "chat_template.jinja")
    assert "(line 3: '{{ messages.role.x }}')" in err.value.what


def test_verify_decodes_text_prompts_as_they_are_served(chat_tok, store, tmp_path, capsys):
    """verify's text prompts go through the chat template too (issue 77, 3: what it measures is what tune-tree
    predicted, on prompts of the same kind); token ids stay as they are; --chat_template none turns it off."""
    from conftest import convert_to

    from trtllm_medusa_ports.cli import main

    base = tiny_base(store, ARCH)
    heads = save_heads(random_heads(tiny_config(ARCH).hidden_size, tiny_config(ARCH).vocab_size, num_heads=2),
                       tmp_path / "heads")
    ckpt = convert_to(tmp_path / "ckpt", base, heads, dtype="bfloat16")
    served = api.verify(api.VerifyOptions(base, ckpt, max_new_tokens=3, quiet=True, tokenizer_dir=chat_tok,
                                          prompts=api.PromptInputs(prompt=["t5 t6"])))
    assert served.ok and served.prompts == [[1, 5, 6, 2, 3]] and served.chat_template == CHAT_APPLIED, served.render()
    assert f"prompts         : chat template {CHAT_APPLIED}" in served.render()
    ids = api.verify(api.VerifyOptions(base, ckpt, max_new_tokens=3, quiet=True, tokenizer_dir=chat_tok,
                                       prompts=api.PromptInputs(prompt_ids=[[5, 6]])))
    assert ids.prompts == [[5, 6]] and ids.chat_template is None and "chat template" not in ids.render()
    assert main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--prompt", "t5 t6",
                 "--tokenizer_dir", str(chat_tok), "--chat_template", "none", "--max_new_tokens", "3", "--json",
                 "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["prompts"] == [[5, 6]] and got["chat_template"] == CHAT_OFF
