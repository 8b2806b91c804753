"""Chat templates: the tiny models' templates on a 3-message conversation, real models' templates
(Qwen 2's ChatML, Phi-3's, Command R's, Gemma 4's) against their own Jinja rendering, the plain
fallback, and templates that try to escape the sandbox or run without end."""

import json
import time
from pathlib import Path

import pytest

from conftest import TINY_BPE, TINY_SPM, VOCAB_BPE
from llmplan.models.chat_template import PLAIN_TEMPLATE, render_chat
from llmplan.models.errors import ChatTemplateError
from llmplan.models.tokenizer import load_tokenizer

DATA = Path(__file__).parent / "data"
# per cut real vocabulary, its template's prompts as llama-cpp-python's Jinja formatter renders them
# (scripts/llamacpp_tokenizer_refs.py)
REAL = [(vocab, case) for vocab, entry in
        sorted(json.loads((DATA / "llamacpp_pretokenizers.json").read_text())["vocabs"].items())
        for case in entry.get("chat", [])]

MESSAGES = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": " Hi, how can I help? "},
    {"role": "user", "content": "Name a prime."},
]


def test_tiny_spm_template():
    prompt = load_tokenizer(TINY_SPM).render_chat(MESSAGES)
    assert prompt == ("<s><start_of_turn>user\nHello!<end_of_turn>\n"
                      "<start_of_turn>assistant\nHi, how can I help?<end_of_turn>\n"
                      "<start_of_turn>user\nName a prime.<end_of_turn>\n"
                      "<start_of_turn>model\n")


def test_tiny_bpe_template():
    tok = load_tokenizer(TINY_BPE)
    prompt = tok.render_chat(MESSAGES)
    assert prompt == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\nHi, how can I help?<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nName a prime.<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tok.render_chat(MESSAGES, add_generation_prompt=False).endswith("Name a prime.<|eot_id|>")
    # the rendered prompt tokenizes to the turn markers as single ids when special tokens are parsed
    ids = tok.encode(prompt, add_special=False, parse_special=True)
    assert ids[0] == tok.bos and ids.count(tok.vocab.token_to_id["<|eot_id|>"]) == 3


@pytest.mark.parametrize("vocab, case", REAL, ids=[f"{v[6:-5]}-{i}" for i, (v, _) in enumerate(REAL)])
def test_real_templates_render_as_their_jinja(vocab, case):
    tok = load_tokenizer(DATA / vocab)
    assert tok.render_chat(case["messages"], add_generation_prompt=case["add_generation_prompt"]) == case["prompt"]


def test_chatml():
    """Qwen 2's template (ChatML), written out: its default system message when none is given."""
    tok = load_tokenizer(DATA / "vocab-qwen2.gguf")
    assert tok.render_chat([{"role": "user", "content": "Hello!"}]) == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n")
    system = [{"role": "system", "content": "You are terse."}, *MESSAGES]
    assert tok.render_chat(system, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\n Hi, how can I help? <|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n")
    ids = tok.encode_chat(system)
    im_end = tok.vocab.token_to_id["<|im_end|>"]
    assert ids.count(im_end) == 4 and im_end in tok.eog and ids[0] == tok.vocab.token_to_id["<|im_start|>"]


def test_phi3():
    """Phi-3's template, written out: BOS as text, no system turn, <|assistant|> after every user turn."""
    tok = load_tokenizer(DATA / "vocab-phi-3.gguf")
    system = [{"role": "system", "content": "You are terse."}, *MESSAGES]
    prompt = ("<s><|user|>\nHello!<|end|>\n<|assistant|>\n Hi, how can I help? <|end|>\n"
              "<|user|>\nName a prime.<|end|>\n<|assistant|>\n")
    assert tok.render_chat(system) == prompt == tok.render_chat(system, add_generation_prompt=False)
    ids = tok.encode_chat(system)
    end = tok.vocab.token_to_id["<|end|>"]
    assert ids.count(tok.bos) == 1 and ids[0] == tok.bos and ids.count(end) == 3 and end in tok.eog


def test_plain_fallback_without_template():
    tok = load_tokenizer(VOCAB_BPE)
    assert tok.vocab.chat_template is None
    assert tok.render_chat(MESSAGES) == "user: Hello!\nassistant:  Hi, how can I help? \nuser: Name a prime.\nassistant:"
    assert render_chat(None, MESSAGES) == render_chat(PLAIN_TEMPLATE, MESSAGES)


@pytest.mark.parametrize("template, match", [
    ("{{ ''.__class__.__mro__ }}", "leave its sandbox: access to attribute '__class__'"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "leave its sandbox"),
    ("{{ lipsum.__globals__ }}", "leave its sandbox: access to attribute '__globals__'"),
    ("{{ cycler.__init__.__globals__.os }}", "leave its sandbox"),
    ("{{ messages.append(1) }}", "leave its sandbox"),
    ("{{ range(10**9) | list }}", "exceed the output bound"),
    ("{% for i in range(10**9) %}x{% endfor %}", "exceed the output bound"),
    ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recursed without end"),
    ("{% macro f(n) %}{% for i in range(9) %}{{ f(n + 1) }}{% endfor %}{% endmacro %}{{ f(0) }}",
     "recursed without end"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "longer than 1 s"),
    ("{{ 'x' * 10**9 }}", "exceed the output bound"),
    ("{{ 7 ** 1000000000 }}", "exceed the output bound"),
    ("{{ 'x' | center(10**9) }}", "exceed the output bound"),
    ("{{ '%0999999999d' % 1 }}", "format width"),
    ("{{ '{:>999999999}'.format(1) }}", "format width"),
    ("{% for i in range(99999) %}{{ 'x' * 99 }}{% endfor %}", "the rendered prompt would exceed"),
    ("{{ raise_exception('system messages are not supported') }}", "refused the conversation: system"),
    ("{% for m in messages %}", "does not parse"),
    ("{{ messages[0]['content'] + 1 }}", "chat template failed: TypeError"),
])
def test_hostile_templates_fail_cleanly(template, match):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(template, MESSAGES)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    ([{"content": "x"}], r"messages\[0\] must be an object with a string 'role'"),
    ([{"role": "user", "content": 5}], r"messages\[0\].content must be"),
])
def test_bad_messages(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(None, messages)


def test_template_features():
    tpl = ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson }};{% endfor %}"
           "{{ strftime_now('%Y') | length }}")
    out = render_chat(tpl, [{"role": "user", "content": "é"}] * 3)
    assert out == '{"role": "user", "content": "é"};{"role": "user", "content": "é"};4'
