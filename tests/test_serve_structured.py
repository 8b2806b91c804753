"""Structured outputs and tool calls through `plan serve`, asked with the real openai client of the real
Gemma 3 270M: json_schema answers validate against their schema (greedy and sampled, streamed and
not), json_object answers are JSON objects, tool_choice "required" gives a call whose arguments
validate, a grammar that cannot finish ends at max_tokens, and four requests in flight together, two
constrained and two free, each get what they get alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from serve_harness import Served  # noqa: F401 (skips this module without the serve extras)

from conftest import GEMMA_KEY

openai = pytest.importorskip("openai")

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe Bob, who is 42 and has a cat, as JSON."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                        "required": ["tz"]}}}


@pytest.fixture(scope="module")
def client(served_gemma):
    return openai.OpenAI(base_url=served_gemma.url + "/v1", api_key=GEMMA_KEY, max_retries=0, timeout=120)


def _person(**kw):
    return dict(model="gemma", messages=ASK, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}, **kw)


def _streamed(client, **kw) -> tuple[str, str]:
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_json_schema_answers_validate(client, temperature):
    r = client.chat.completions.create(**_person(temperature=temperature, seed=7))
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    text, finish = _streamed(client, **_person(temperature=temperature, seed=7))
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    if temperature == 0:
        assert text == r.choices[0].message.content  # greedy: streaming changes nothing


def test_json_object_answers_are_objects(client):
    for prompt in ('{"color": "red", "wheels": 4} is a JSON object. Another JSON object:',
                   'Write {"ok": true} and nothing else.'):
        r = client.completions.create(model="gemma", prompt=prompt, max_tokens=40, temperature=0,
                                      extra_body={"response_format": {"type": "json_object"}})
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].text), dict)
    r = client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "Reply in JSON: hi"}],
                                       max_tokens=40, temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_call_validates(client, choice, stream):
    kw = dict(model="gemma", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=60,
              temperature=0, tools=[WEATHER, TIME], tool_choice=choice)
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for d in chunk.choices[0].delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
                c["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        calls = list(calls.values())
    else:
        r = client.chat.completions.create(**kw)
        finish = r.choices[0].finish_reason
        assert r.choices[0].message.content is None
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in r.choices[0].message.tool_calls]
    assert finish == "tool_calls" and len(calls) == 1 and calls[0]["id"].startswith("call_")
    tool = {t["function"]["name"]: t["function"] for t in (WEATHER, TIME)}[calls[0]["name"]]
    assert isinstance(choice, str) or calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), tool["parameters"])


def test_a_conversation_carries_calls_and_results(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    r = client.chat.completions.create(model="gemma", max_tokens=24, temperature=0, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}])
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_grammar_that_cannot_finish_ends_at_max_tokens(client):
    r = client.completions.create(model="gemma", prompt="Say", max_tokens=8, temperature=0,
                                  extra_body={"grammar": 'root ::= "la"{100} "!"'})  # 201 bytes: past 8 tokens
    assert r.choices[0].finish_reason == "length" and ("la" * 100).startswith(r.choices[0].text)


def test_a_mixed_batch_gives_each_request_what_it_gets_alone(client, served_gemma):
    asks = [_person(temperature=0), dict(model="gemma", messages=ASK, max_tokens=16, temperature=0),
            dict(model="gemma", messages=[{"role": "user", "content": "Weather in Rome?"}], max_tokens=60,
                 temperature=0, tools=[WEATHER], tool_choice="required"),
            dict(model="gemma", messages=[{"role": "user", "content": "Name a color."}], max_tokens=16, temperature=0)]

    def answer(kw):
        m = client.chat.completions.create(**kw).choices[0].message
        return m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]

    alone = [answer(kw) for kw in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(answer, asks))
    assert together == alone
    jsonschema.validate(json.loads(together[0][0]), PERSON)
