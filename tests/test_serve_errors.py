"""Bad requests to `plan serve`: each is a 4xx with OpenAI's error JSON naming what is wrong, never a
500 or a traceback, and the server keeps serving."""

from __future__ import annotations

import json

import pytest

from serve_harness import Served  # noqa: F401 (skips this module without the serve extras)

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"prompt": "hi", "max_tokens": 2}
MSG = [{"role": "user", "content": "hi"}]

# (name, method, path, body: a dict sent as JSON or raw bytes, status, error type, param)
CASES = [
    ("not JSON", "POST", C, b'{"prompt": "hi",', 400, "invalid_request_error", None),
    ("not UTF-8", "POST", C, b'{"prompt": "\xff\xfe"}', 400, "invalid_request_error", None),
    ("NaN is not JSON", "POST", C, b'{"prompt": "hi", "temperature": NaN}', 400, "invalid_request_error", None),
    ("nested too deep", "POST", C, b"[" * 100000 + b"]" * 100000, 400, "invalid_request_error", None),
    ("a list, not an object", "POST", C, b"[1, 2]", 400, "invalid_request_error", None),
    ("empty body", "POST", C, b"", 400, "invalid_request_error", None),
    ("no prompt", "POST", C, {"max_tokens": 2}, 400, "invalid_request_error", "prompt"),
    ("prompt a number", "POST", C, {"prompt": 5}, 400, "invalid_request_error", "prompt"),
    ("prompt empty list", "POST", C, {"prompt": []}, 400, "invalid_request_error", "prompt"),
    ("several prompts", "POST", C, {"prompt": ["a", "b"]}, 400, "invalid_request_error", "prompt"),
    ("token id outside the vocabulary", "POST", C, {"prompt": [1, 3000]}, 400, "invalid_request_error", "prompt"),
    ("token ids as floats", "POST", C, {"prompt": [1, 2.5]}, 400, "invalid_request_error", "prompt"),
    ("prompt longer than the context", "POST", C, {"prompt": list(range(5, 305))}, 400, "invalid_request_error",
     "prompt"),
    ("max_tokens 0", "POST", C, OK | {"max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens negative", "POST", C, OK | {"max_tokens": -3}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens a string", "POST", C, OK | {"max_tokens": "8"}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens a bool", "POST", C, OK | {"max_tokens": True}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens a float", "POST", C, OK | {"max_tokens": 8.5}, 400, "invalid_request_error", "max_tokens"),
    ("temperature negative", "POST", C, OK | {"temperature": -0.1}, 400, "invalid_request_error", "temperature"),
    ("temperature a string", "POST", C, OK | {"temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ("top_p 0", "POST", C, OK | {"top_p": 0}, 400, "invalid_request_error", "top_p"),
    ("top_p above 1", "POST", C, OK | {"top_p": 1.5}, 400, "invalid_request_error", "top_p"),
    ("top_k below -1", "POST", C, OK | {"top_k": -2}, 400, "invalid_request_error", "top_k"),
    ("min_p 1", "POST", C, OK | {"min_p": 1}, 400, "invalid_request_error", "min_p"),
    ("repetition_penalty 0", "POST", C, OK | {"repetition_penalty": 0}, 400, "invalid_request_error",
     "repetition_penalty"),
    ("seed negative", "POST", C, OK | {"seed": -1}, 400, "invalid_request_error", "seed"),
    ("n 2", "POST", C, OK | {"n": 2}, 400, "invalid_request_error", "n"),
    ("best_of 3", "POST", C, OK | {"best_of": 3}, 400, "invalid_request_error", "best_of"),
    ("echo", "POST", C, OK | {"echo": True}, 400, "invalid_request_error", "echo"),
    ("presence_penalty", "POST", C, OK | {"presence_penalty": 0.5}, 400, "invalid_request_error", "presence_penalty"),
    ("logit_bias", "POST", C, OK | {"logit_bias": {"5": 10}}, 400, "invalid_request_error", "logit_bias"),
    ("stop empty string", "POST", C, OK | {"stop": [""]}, 400, "invalid_request_error", "stop"),
    ("stop a number", "POST", C, OK | {"stop": 5}, 400, "invalid_request_error", "stop"),
    ("stream a string", "POST", C, OK | {"stream": "yes"}, 400, "invalid_request_error", "stream"),
    ("stream_options without stream", "POST", C, OK | {"stream_options": {"include_usage": True}}, 400,
     "invalid_request_error", "stream_options"),
    ("stream_options unknown key", "POST", C, OK | {"stream": True, "stream_options": {"x": 1}}, 400,
     "invalid_request_error", "stream_options"),
    ("logprobs above 20", "POST", C, OK | {"logprobs": 21}, 400, "invalid_request_error", "logprobs"),
    ("unknown field", "POST", C, OK | {"max_token": 5}, 400, "invalid_request_error", "max_token"),
    ("no messages", "POST", CHAT, {"max_tokens": 2}, 400, "invalid_request_error", "messages"),
    ("messages empty", "POST", CHAT, {"messages": []}, 400, "invalid_request_error", "messages"),
    ("message not an object", "POST", CHAT, {"messages": ["hi"]}, 400, "invalid_request_error", "messages[0]"),
    ("unknown role", "POST", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_request_error",
     "messages[0].role"),
    ("content a number", "POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "invalid_request_error",
     "messages[0].content"),
    ("an image part", "POST", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                              "image_url": {"url": "x"}}]}]},
     400, "invalid_request_error", "messages[0].content[0]"),
    ("chat logprobs an integer", "POST", CHAT, {"messages": MSG, "logprobs": 3}, 400, "invalid_request_error",
     "logprobs"),
    ("top_logprobs without logprobs", "POST", CHAT, {"messages": MSG, "top_logprobs": 2}, 400,
     "invalid_request_error", "top_logprobs"),
    ("tools", "POST", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "invalid_request_error", "tools"),
    ("json response format", "POST", CHAT, {"messages": MSG, "response_format": {"type": "json_object"}}, 400,
     "invalid_request_error", "response_format"),
    ("chat prompt longer than the context", "POST", CHAT,
     {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "invalid_request_error", "messages"),
    ("tokenize without a prompt", "POST", "/tokenize", {}, 400, "invalid_request_error", "prompt"),
    ("detokenize ids outside the vocabulary", "POST", "/detokenize", {"tokens": [1, -2]}, 400,
     "invalid_request_error", "tokens"),
    ("GET on a POST endpoint", "GET", C, None, 405, "invalid_request_error", None),
    ("no such endpoint", "POST", "/v1/embeddings", OK, 404, "not_found_error", None),
]


@pytest.fixture(scope="module")
def before(served):
    return served.wait_idle()


@pytest.mark.parametrize("name,method,path,body,status,kind,param", CASES, ids=[c[0] for c in CASES])
def test_a_bad_request_is_a_4xx_in_openais_shape(served, before, name, method, path, body, status, kind, param):
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    r = served.http.request(method, path, content=content)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and "Traceback" not in r.text
    assert (err["type"], err["param"]) == (kind, param), err


def test_the_table_is_large_and_the_server_is_unharmed(served, before):
    assert len(CASES) >= 20
    r = served.http.request("POST", C, content=json.dumps({"prompt": list(range(5, 305))}).encode())
    assert "256" in r.json()["error"]["message"] and r.json()["error"]["code"] == "context_length_exceeded"
    after = served.wait_idle()
    assert after["llmplan_kv_blocks_free"] == before["llmplan_kv_blocks_free"]
    assert served.post(C, OK).status_code == 200
