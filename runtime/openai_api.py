"""The OpenAI API as `plan serve` speaks it: request bodies checked field by field (one table per
endpoint) into what the engine runs, and the JSON of answers, stream chunks and errors.

A field OpenAI defines that would change the answer is accepted only at the value we honour (`n` 1,
no penalties, ...): anything else is a 400 naming it rather than a silently different result. A
field OpenAI does not define is a 400 as well, as OpenAI answers it, but for the extensions vLLM and
llama.cpp's server take (`top_k`, `min_p`, `repetition_penalty`, `return_token_ids`, `grammar`). JSON
null means the default everywhere. `response_format` and `grammar` become the request's grammar
(runtime/grammar.py), `tools` and `tool_choice` a runtime/tool_calls.py offer."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import grammar, tool_calls
from .grammar import Grammar, GrammarError
from .requests import MAX_LOGPROBS, Event, RequestError, SamplingParams, TokenLogprobs
from .tool_calls import Call, CallParser, Tool

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request answered with OpenAI's error JSON instead of a result."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


# --- field checks: each takes (value, field name) and returns the value to use, or raises -----------

Check = Callable[[Any, str], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(lo: int, hi: int | None = None) -> Check:
    def check(v: Any, name: str) -> int:
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            raise _bad(name, f"must be an integer {f'in {lo}..{hi}' if hi is not None else f'>= {lo}'}, got {v!r}")
        return v
    return check


def number(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    span = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}{')' if hi_open or hi is None else ']'}"

    def check(v: Any, name: str) -> float:
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and (v > lo if lo_open else v >= lo)
              and (hi is None or (v < hi if hi_open else v <= hi)))
        if not ok:
            raise _bad(name, f"must be a number in {span}, got {v!r}")
        return float(v)
    return check


def boolean(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {v!r}")
    return v


def string(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise _bad(name, f"must be a string, got {type(v).__name__}")
    return v


def only(*allowed: Any, why: str) -> Check:
    """A field accepted at its neutral values only (checked by value and JSON type)."""
    def check(v: Any, name: str) -> Any:
        if not any(v == a and type(v) is type(a) or (isinstance(a, float) and _is_int(v) and v == a) for a in allowed):
            raise _bad(name, f"{v!r} is not supported: {why}")
        return v
    return check


def top_k(v: Any, name: str) -> int:
    return 0 if v == -1 and _is_int(v) else integer(0)(v, name)  # vLLM's -1 also means no limit


def stop(v: Any, name: str) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad(name, "must be a non-empty string or a list of them")
    return tuple(stops)


def stream_options(v: Any, name: str) -> bool:
    """Whether the stream ends with a usage chunk."""
    if not isinstance(v, dict) or set(v) - {"include_usage"}:
        raise _bad(name, 'must be an object {"include_usage": true|false}')
    return boolean(v.get("include_usage", False), f"{name}.include_usage")


def prompt(v: Any, name: str) -> str | list[int]:
    """One prompt: a text or a list of token ids (a list holding one of those is that one)."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(_is_int(t) for t in v):
        return v
    if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
        raise _bad(name, f"holds {len(v)} prompts; this server takes one prompt per request")
    raise _bad(name, "must be a string or a non-empty list of token ids")


def messages(v: Any, name: str) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them: role and text (content parts joined), an
    assistant's tool calls (arguments as objects) and a tool result's call id."""
    if not isinstance(v, list) or not v:
        raise _bad(name, "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with a role and content")
        extra = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"}
        if extra:
            raise _bad(f"{where}.{sorted(extra)[0]}", "is not a message field this server takes")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        msg = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), where)}
        if m.get("name") is not None:
            msg["name"] = string(m["name"], f"{where}.name")
        if m.get("tool_calls"):
            if role != "assistant":
                raise _bad(f"{where}.tool_calls", "only an assistant message has tool calls")
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if m.get("tool_call_id") is not None:
            msg["tool_call_id"] = string(m["tool_call_id"], f"{where}.tool_call_id")
        out.append(msg)
    return out


def _tool_calls(v: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise _bad(where, "must be a list of tool calls")
    out = []
    for j, c in enumerate(v):
        at = f"{where}[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise _bad(at, 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
        try:
            args = json.loads(f.get("arguments") or "{}")
        except (TypeError, ValueError, RecursionError):
            raise _bad(f"{at}.function.arguments", "must be a JSON object as text") from None
        if not isinstance(args, dict):
            raise _bad(f"{at}.function.arguments", "must be a JSON object as text")
        out.append({"id": str(c.get("id", "")), "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def response_format(v: Any, name: str) -> Grammar | None:
    """OpenAI's response_format: text (no grammar), json_object, or json_schema {name, schema, strict}."""
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "text" and set(v) == {"type"}:
        return None
    try:
        if kind == "json_object" and set(v) == {"type"}:
            return grammar.json_object(name)
        if kind == "json_schema":
            js = v.get("json_schema")
            if set(v) != {"type", "json_schema"} or not isinstance(js, dict):
                raise _bad(name, '{"type": "json_schema"} needs "json_schema": {"name", "schema", "strict"}')
            unknown = set(js) - {"name", "schema", "strict", "description"}
            if unknown:
                raise _bad(f"{name}.json_schema.{sorted(unknown)[0]}", "unrecognized field")
            if not isinstance(js.get("name"), str) or not js["name"]:
                raise _bad(f"{name}.json_schema.name", "is required: a name for the schema")
            if js.get("strict") is not None:
                boolean(js["strict"], f"{name}.json_schema.strict")
            return grammar.json_schema(js.get("schema", {}), f"{name}.json_schema.schema")
    except GrammarError as e:
        raise ApiError(400, str(e), param=e.param) from None
    raise _bad(name, 'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
                     '{"name", "schema", "strict"}}')


def grammar_text(v: Any, name: str) -> Grammar:
    """llama.cpp's and vLLM's `grammar`: a GBNF or Lark grammar the output must match."""
    try:
        return grammar.lark_or_gbnf(v, name)
    except GrammarError as e:
        raise ApiError(400, str(e), param=e.param) from None


def tools(v: Any, name: str) -> list[Tool]:
    if not isinstance(v, list):
        raise _bad(name, "must be a list of tools")
    out: dict[str, Tool] = {}
    for i, t in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise _bad(where, 'must be {"type": "function", "function": {"name", "description", "parameters"}}')
        f = t["function"]
        unknown = set(f) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise _bad(f"{where}.function.{sorted(unknown)[0]}", "unrecognized field")
        fname = f.get("name")
        if not isinstance(fname, str) or not tool_calls.NAME.match(fname):
            raise _bad(f"{where}.function.name", "must be 1 to 64 letters, digits, underscores or dashes")
        if fname in out:
            raise _bad(f"{where}.function.name", f"{fname!r} is offered twice")
        params = f.get("parameters", tool_calls.NO_PARAMETERS)
        try:
            grammar.json_schema(params, f"{where}.function.parameters")  # checked now: a bad schema is a 400
        except GrammarError as e:
            raise ApiError(400, str(e), param=e.param) from None
        out[fname] = Tool(fname, string(f.get("description", ""), f"{where}.function.description"), params)
    return list(out.values())


def tool_choice(v: Any, name: str) -> str:
    """"none", "auto", "required", or the name of the function that must be called."""
    if v in ("none", "auto", "required"):
        return v
    f = v.get("function") if isinstance(v, dict) and v.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise _bad(name, 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    return f["name"]


def _content(c: Any, where: str) -> str:
    if c is None or isinstance(c, str):
        return c or ""
    if not isinstance(c, list):
        raise _bad(f"{where}.content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(c):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise _bad(f"{where}.content[{j}]", 'only text parts ({"type": "text", "text": ...}) are supported')
        texts.append(part["text"])
    return "\n".join(texts)


REQUIRED = object()
_NO_PENALTIES = "penalties other than repetition_penalty are not implemented"

# Fields both endpoints take: name -> (check, default).
SAMPLING: dict[str, tuple[Check, Any]] = {
    "model": (string, None),  # one model is served: any name reaches it
    "temperature": (number(0), 1.0),
    "top_p": (number(0, 1, lo_open=True), 1.0),
    "top_k": (top_k, 0),
    "min_p": (number(0, 1, hi_open=True), 0.0),
    "repetition_penalty": (number(0, lo_open=True), 1.0),
    "seed": (integer(0), None),
    "stop": (stop, ()),
    "n": (only(1, why="one choice per request"), 1),
    "stream": (boolean, False),
    "stream_options": (stream_options, None),
    "presence_penalty": (only(0.0, why=_NO_PENALTIES), 0.0),
    "frequency_penalty": (only(0.0, why=_NO_PENALTIES), 0.0),
    "logit_bias": (only({}, why="logit_bias is not implemented"), None),
    "user": (string, None),
    "return_token_ids": (boolean, False),  # vLLM's extension: the prompt's and the answer's token ids
    "response_format": (response_format, None),
    "grammar": (grammar_text, None),  # llama.cpp's and vLLM's extension: a GBNF or Lark grammar
}

COMPLETION_FIELDS = SAMPLING | {
    "prompt": (prompt, REQUIRED),
    "max_tokens": (integer(1), 16),  # OpenAI's default for completions
    "logprobs": (integer(0, MAX_LOGPROBS), None),
    "echo": (only(False, why="the prompt is not echoed"), False),
    "suffix": (only("", why="insertion is not supported"), None),
    "best_of": (only(1, why="one candidate per request"), 1),
}

CHAT_FIELDS = SAMPLING | {
    "messages": (messages, REQUIRED),
    "max_tokens": (integer(1), None),
    "max_completion_tokens": (integer(1), None),
    "logprobs": (boolean, False),
    "top_logprobs": (integer(0, MAX_LOGPROBS), None),
    "tools": (tools, None),
    "tool_choice": (tool_choice, None),
    "parallel_tool_calls": (boolean, None),  # a constrained call is one call, which either value allows
}


def _fields(body: dict[str, Any], table: dict[str, tuple[Check, Any]]) -> dict[str, Any]:
    unknown = [k for k in body if k not in table]
    if unknown:
        raise _bad(unknown[0], "unrecognized request argument")
    out = {}
    for name, (check, default) in table.items():
        v = body.get(name)
        if v is None:
            if default is REQUIRED:
                raise _bad(name, "is required")
            out[name] = default
        else:
            out[name] = check(v, name)
    return out


@dataclass
class Ask:
    """A checked request: what the engine runs (prompt or messages to render, limits, sampling, the
    grammar its output must match) and how the answer is written."""

    chat: bool
    prompt: str | list[int] | list[dict[str, Any]]  # text or ids (completions), messages (chat)
    max_tokens: int | None  # None: up to the context
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # top alternatives per token; None: no logprobs
    token_ids: bool
    grammar: Grammar | None = None
    tools: list[Tool] | None = None  # the tools offered (None: none, or tool_choice "none")
    tool_choice: str | None = None  # None: the model decides; "required"; or the function to call


def parse_completion(body: dict[str, Any]) -> Ask:
    f = _fields(body, COMPLETION_FIELDS)
    return _ask(f, False, f["prompt"], f["max_tokens"], f["logprobs"])


def parse_chat(body: dict[str, Any]) -> Ask:
    f = _fields(body, CHAT_FIELDS)
    if f["top_logprobs"] is not None and not f["logprobs"]:
        raise _bad("top_logprobs", "needs logprobs: true")
    top = (f["top_logprobs"] or 0) if f["logprobs"] else None
    ask = _ask(f, True, f["messages"], f["max_completion_tokens"] or f["max_tokens"], top)
    choice, offered = f["tool_choice"], f["tools"]
    if choice is not None and not offered:
        raise _bad("tool_choice", "is only allowed when tools are given")
    if choice not in (None, "none", "auto", "required") and choice not in {t.name for t in offered}:
        raise _bad("tool_choice.function.name", f"{choice!r} is not one of the tools")
    if offered and choice != "none":
        ask.tools, ask.tool_choice = offered, None if choice in (None, "auto") else choice
        if ask.tool_choice is not None and ask.grammar is not None:
            raise _bad("tool_choice", "a required tool call cannot be combined with response_format or grammar")
    return ask


def _ask(f: dict[str, Any], chat: bool, what: Any, max_tokens: int | None, logprobs: int | None) -> Ask:
    if f["stream_options"] is not None and not f["stream"]:
        raise _bad("stream_options", "is only allowed with stream: true")
    if f["response_format"] is not None and f["grammar"] is not None:
        raise _bad("grammar", "give response_format or grammar, not both")
    try:
        params = SamplingParams(f["temperature"], f["top_k"], f["top_p"], f["min_p"], f["repetition_penalty"],
                                f["seed"])
    except RequestError as e:
        raise ApiError(400, str(e)) from None
    return Ask(chat, what, max_tokens, params, f["stop"], f["stream"], bool(f["stream_options"]), logprobs,
               f["return_token_ids"], f["response_format"] or f["grammar"])


# --- answers -----------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """The JSON of one request's answer, whole or as stream chunks, in OpenAI's shapes for completions
    ("text_completion") or chat ("chat.completion", chunks "chat.completion.chunk")."""

    def __init__(self, ask: Ask, model: str, piece: Callable[[int], bytes], syntax: str | None = None):
        self.ask, self.model, self.piece = ask, model, piece
        self.id = f"{'chatcmpl' if ask.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._offset = 0  # completions' logprobs.text_offset runs over the whole answer
        # the model's tool calls (`syntax`: runtime/tool_calls.py's, for the model's template) out of its text
        self.calls = CallParser(ask.tools, syntax) if ask.tools else None

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.ask.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, events: list[Event], finish: str, prompt_ids: list[int], ids: list[int]) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if self.ask.chat:
            calls: list[Call] = []
            if self.calls is not None:
                shown, calls = self.calls.push(text)
                rest, more = self.calls.flush()
                text, calls = shown + rest, calls + more
            choice["message"] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                choice["message"]["tool_calls"] = [_call_json(c) for c in calls]
                finish = "tool_calls"
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(events)
        choice["finish_reason"] = finish
        if self.ask.token_ids:
            choice |= {"prompt_token_ids": prompt_ids, "token_ids": ids}
        return self._envelope(False) | {"choices": [choice], "usage": usage(len(prompt_ids), len(ids))}

    def chunk(self, text: str, events: list[Event], finish: str | None = None, first: bool = False) -> dict | None:
        """A stream chunk, or None when the text is held back (a tool call being written) and the chunk
        would carry nothing."""
        choice: dict[str, Any] = {"index": 0}
        if self.ask.chat:
            calls: list[Call] = []
            if self.calls is not None:
                text, calls = self.calls.push(text)
                if finish is not None:
                    rest, more = self.calls.flush()
                    text, calls = text + rest, calls + more
            choice["delta"] = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            if calls:
                done = len(self.calls.calls) - len(calls)
                choice["delta"]["tool_calls"] = [{"index": done + i} | _call_json(c) for i, c in enumerate(calls)]
            if finish is not None and self.calls is not None and self.calls.calls:
                finish = "tool_calls"
            if not choice["delta"] and finish is None and self.ask.logprobs is None and not self.ask.token_ids:
                return None
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(events)
        choice["finish_reason"] = finish
        if self.ask.token_ids:
            choice["token_ids"] = [e.token for e in events if e.token is not None]
        return self._envelope(True) | {"choices": [choice]} | ({"usage": None} if self.ask.include_usage else {})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return self._envelope(True) | {"choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def _logprobs(self, events: list[Event]) -> dict[str, Any] | None:
        if self.ask.logprobs is None:
            return None
        got = [(e.token, e.logprobs) for e in events if e.logprobs is not None]
        if self.ask.chat:
            return {"content": [self._chat_entry(t, lp) for t, lp in got]}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp in got:
            s = self._text(t)
            out["tokens"].append(s)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self._text(a): v for a, v in lp.top})
            out["text_offset"].append(self._offset)
            self._offset += len(s)
        return out

    def _chat_entry(self, token: int, lp: TokenLogprobs) -> dict[str, Any]:
        one = lambda t, v: {"token": self._text(t), "logprob": v, "bytes": list(self.piece(t))}  # noqa: E731
        return one(token, lp.logprob) | {"top_logprobs": [one(a, v) for a, v in lp.top]}

    def _text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")


def _call_json(c: Call) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
