"""Tool calls (runtime/tool_calls.py): the call syntax a chat template renders, the prompt for a model
whose template takes no tools, the parser that turns a streamed answer into content and calls whatever
the pieces, and the grammar that makes a required call valid against its function's schema."""

from __future__ import annotations

import json

import pytest

from llmplan.core.numerics import mask_words
from llmplan.models.chat_template import render_chat
from llmplan.models.gguf import GGUFFile
from llmplan.models.tokenizer import load_tokenizer
from llmplan.runtime import tool_calls as tc
from llmplan.runtime.grammar import Vocabulary
from llmplan.runtime.requests import RequestError

from conftest import TINY_BPE

WEATHER = tc.Tool("get_weather", "The weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False})
TIME = tc.Tool("get_time", "The time", tc.NO_PARAMETERS)
# the parts of Qwen 2.5's and Llama 3.1's templates that decide the syntax
QWEN = ('{%- if tools %}{{- "<tools>" }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}'
        '{{- "</tools> <tool_call>" }}{%- endif %}{%- for m in messages %}{{- m.role + ": " + (m.content or "") }}'
        '{%- for c in m.tool_calls or [] %}{{- "<tool_call>" + c.function.name + (c.function.arguments | tojson) }}'
        '{%- endfor %}{%- endfor %}')
LLAMA = '{%- if tools %}{{- "<|python_tag|>" }}{{- tools | tojson }}{%- endif %}{{- "parameters" }}'


def test_the_syntax_of_a_template():
    assert tc.syntax_of(QWEN) == "hermes" and tc.syntax_of(LLAMA) == "llama3"
    assert tc.syntax_of(None) is None and tc.syntax_of("{{ messages }}") is None
    assert tc.syntax_of("{% if tools %}{{ tools }}{% endif %}") is None  # takes tools, syntax unknown: generic


def test_a_template_that_takes_tools_renders_them_and_the_calls():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": {"city": "Oslo", "unit": "c"}}}]}]
    msgs, extra = tc.prompt(messages, [WEATHER], None, "hermes")
    assert msgs is messages and [t["function"]["name"] for t in extra["tools"]] == ["get_weather"]
    text = render_chat(QWEN, msgs, **extra)
    assert '"name": "get_weather"' in text and '<tool_call>get_weather{"city": "Oslo", "unit": "c"}' in text


def test_the_generic_prompt_writes_calls_and_results_as_turns():
    call = {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo",
                                                                                             "unit": "c"}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call, call]},
                {"role": "tool", "tool_call_id": "1", "content": "cold"},
                {"role": "tool", "tool_call_id": "1", "content": "wet"}]
    msgs, extra = tc.prompt(messages, [WEATHER, TIME], "required", None)
    assert extra == {} and [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\nYou can call these tools")
    assert '"name": "get_time"' in msgs[0]["content"] and "You must call one of the tools." in msgs[0]["content"]
    assert msgs[2]["content"].count("<tool_call>\n{\"name\": \"get_weather\"") == 2
    assert msgs[3]["content"] == "<tool_response>\ncold\n</tool_response>\n<tool_response>\nwet\n</tool_response>"
    assert "You must call get_time." in tc.prompt(messages[1:2], [TIME], "get_time", None)[0][0]["content"]


ANSWER = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n'
          '</tool_call> and <tool_call>{"name": "nope", "arguments": {}}</tool_call> done <tool_c')


@pytest.mark.parametrize("step", [1, 2, 7, len(ANSWER)])
def test_hermes_calls_parse_the_same_in_any_pieces(step):
    p = tc.CallParser([WEATHER, TIME], "hermes")
    shown, calls = "", []
    for i in range(0, len(ANSWER), step):
        text, found = p.push(ANSWER[i:i + step])
        assert "<tool_call>\n{" not in text  # a call being written is never shown
        shown, calls = shown + text, calls + found
    rest, more = p.flush()
    shown, calls = shown + rest, calls + more
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo", "unit": "c"})]
    # an unknown tool's block stays content, as does an unfinished tag
    assert shown == 'Let me check.  and <tool_call>{"name": "nope", "arguments": {}}</tool_call> done <tool_c'


def test_llama3_calls_are_the_whole_answer():
    p = tc.CallParser([WEATHER], "llama3")
    assert p.push('<|python_tag|>{"name": "get_weather", ') == ("", [])
    assert p.push('"parameters": {"city": "Rome", "unit": "f"}}') == ("", [])
    _, calls = p.flush()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Rome", "unit": "f"})]
    p = tc.CallParser([WEATHER], "llama3")
    assert p.push("  Sunny") == ("  Sunny", []) and p.push(" today") == (" today", []) and p.flush() == ("", [])
    p = tc.CallParser([WEATHER], "llama3")
    p.push('{"not": "a call"}')
    assert p.flush() == ('{"not": "a call"}', [])


@pytest.fixture(scope="module")
def vocab():
    tok = load_tokenizer(GGUFFile(TINY_BPE))
    return Vocabulary(tok, mask_words(tok.n_tokens))


@pytest.mark.parametrize("syntax", ["hermes", "llama3"])
def test_a_required_calls_grammar_takes_valid_calls_only(vocab, syntax):
    tok = vocab.tokenizer
    key = "parameters" if syntax == "llama3" else "arguments"

    def text(name, args):
        body = json.dumps({"name": name, key: args}, separators=(",", ":"))
        return body if syntax == "llama3" else f"<tool_call>\n{body}\n</tool_call>"

    def takes(g, t):
        m = vocab.matcher(g)
        try:
            for token in tok.encode(t, add_special=False):
                m.consume(token)
        except RequestError:
            return False
        return m.finished

    required = tc.call_grammar([WEATHER, TIME], "required", syntax)
    named = tc.call_grammar([WEATHER, TIME], "get_time", syntax)
    assert takes(required, text("get_weather", {"city": "Oslo", "unit": "c"}))
    assert takes(required, text("get_time", {}))
    assert not takes(required, text("get_weather", {"city": "Oslo", "unit": "kelvin"}))  # not in the enum
    assert not takes(required, text("get_weather", {"city": "Oslo"}))  # a required argument missing
    assert not takes(required, text("get_date", {}))
    assert takes(named, text("get_time", {})) and not takes(named, text("get_weather", {"city": "x", "unit": "c"}))


def test_a_reply_turns_calls_into_openais_tool_calls():
    from llmplan.runtime.openai_api import Reply, parse_chat

    ask = parse_chat({"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER.as_openai()]})
    assert ask.tool_choice is None and [t.name for t in ask.tools] == ["get_weather"]
    text = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    whole = Reply(ask, "m", lambda t: b"").whole(text, [], "stop", [1], [2])["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] == "Sure. "
    (call,) = whole["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    reply = Reply(ask, "m", lambda t: b"")
    chunks = [reply.chunk(text[i:i + 5], [], None) for i in range(0, len(text), 5)] + [reply.chunk("", [], "stop")]
    sent = [c["choices"][0] for c in chunks if c is not None]
    assert "".join(c["delta"].get("content", "") for c in sent) == "Sure. "
    deltas = [d for c in sent for d in c["delta"].get("tool_calls", [])]
    assert [(d["index"], d["function"]["name"]) for d in deltas] == [(0, "get_weather")]
    assert sent[-1]["finish_reason"] == "tool_calls" and None in chunks  # held text sends no empty chunk
